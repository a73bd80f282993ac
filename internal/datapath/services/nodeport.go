package services

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// nodePortProg names the NodePort program's link pins:
// services/links/tcx/<netns cookie>/<ifindex>/ez_svc_nodeport_ingress.
const nodePortProg = servicesProgEzSvcNodeport

// SetNodeAddrs makes the node addresses NodePorts answer on exactly addrs
// (kube-proxy's --nodeport-addresses: by default every address of the
// node).
func (lb *LB) SetNodeAddrs(addrs []netip.Addr) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return errClosed
	}
	want := map[servicesEzSvcBackend]bool{}
	for _, a := range addrs {
		if !a.IsValid() || a.IsUnspecified() {
			return fmt.Errorf("services: node address %q", a)
		}
		want[servicesEzSvcBackend{Addr: as16(a.Unmap())}] = true
	}
	var k servicesEzSvcBackend
	var v uint32
	var stale []servicesEzSvcBackend
	it := lb.objs.EzSvcNodeAddrs.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("services: read node addresses: %w", err)
	}
	for k := range want {
		if err := lb.objs.EzSvcNodeAddrs.Put(k, uint32(1)); err != nil {
			return fmt.Errorf("services: node address: %w", err)
		}
	}
	for _, k := range stale {
		lb.objs.EzSvcNodeAddrs.Delete(k)
	}
	return nil
}

// SyncNodePortDevices makes the devices (ifindexes of the caller's network
// namespace) whose tcx ingress runs the NodePort program exactly ifindexes:
// links pinned by an earlier agent get this load's program in place, new
// ones are attached (after other owners' programs) and pinned (with
// PinDir), those of other devices are detached. A device that vanished
// meanwhile is skipped.
func (lb *LB) SyncNodePortDevices(ifindexes []int) (attached, detached []int, err error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil, nil, errClosed
	}
	if lb.npLinks == nil {
		lb.npLinks = map[int]link.Link{}
	}
	if !bpfsys.UseTCX() {
		return lb.syncNodePortFilters(ifindexes)
	}
	var base string
	if lb.pinDir != "" {
		cookie, err := bpfsys.NetNSCookie("")
		if err != nil {
			return nil, nil, err
		}
		base = bpfsys.LinkPin(lb.pinDir, bpfsys.KindTCX, strconv.FormatUint(cookie, 10))
	}
	pinOf := func(ifx int) string {
		if base == "" {
			return ""
		}
		return filepath.Join(base, strconv.Itoa(ifx), nodePortProg+"_ingress")
	}
	var errs []error
	for _, ifx := range ifindexes {
		if _, ok := lb.npLinks[ifx]; ok {
			continue
		}
		l, err := lb.attachNodePort(ifx, pinOf(ifx))
		if err != nil {
			errs = append(errs, fmt.Errorf("services: NodePort on ifindex %d: %w", ifx, err))
			continue
		}
		lb.npLinks[ifx] = l
		attached = append(attached, ifx)
	}
	for ifx, l := range lb.npLinks {
		if slices.Contains(ifindexes, ifx) {
			continue
		}
		if pin := pinOf(ifx); pin != "" {
			l.Unpin()
			os.Remove(filepath.Dir(pin))
		}
		l.Close()
		delete(lb.npLinks, ifx)
		detached = append(detached, ifx)
	}
	// Pins an earlier agent left for devices not wanted now.
	if base != "" {
		pins, perr := bpfsys.PinnedLinks(lb.pinDir)
		if perr != nil {
			return attached, detached, perr
		}
		for _, pin := range pins {
			if filepath.Dir(filepath.Dir(pin)) != base || filepath.Base(pin) != nodePortProg+"_ingress" {
				continue
			}
			ifx, _ := strconv.Atoi(filepath.Base(filepath.Dir(pin)))
			if _, ok := lb.npLinks[ifx]; ok {
				continue
			}
			if err := bpfsys.UnpinLink(pin); err != nil {
				errs = append(errs, err)
			}
			os.Remove(filepath.Dir(pin))
		}
	}
	return attached, detached, errors.Join(errs...)
}

// attachNodePort updates the link pinned at pin in place, or attaches a
// new one (and pins it).
func (lb *LB) attachNodePort(ifx int, pin string) (link.Link, error) {
	if lb.objs.EzSvcNodeport == nil {
		st, _ := lb.parts.Get(parts.NodePort)
		return nil, fmt.Errorf("NodePort is off on this kernel: %s", st.Reason)
	}
	return bpfsys.AttachPinned(pin, lb.objs.EzSvcNodeport, func(info *link.Info) bool {
		tcx := info.TCX()
		return tcx != nil && int(tcx.Ifindex) == ifx
	}, func() (link.Link, error) {
		return link.AttachTCX(link.TCXOptions{Interface: ifx, Program: lb.objs.EzSvcNodeport, Attach: ebpf.AttachTCXIngress})
	})
}

// npPrio: the legacy tc priority of the NodePort program, after
// ez_close_reset (1) and before what other owners attach at the default
// priorities (tcx: appended after other owners' programs).
const npPrio = 2

// syncNodePortFilters is SyncNodePortDevices on a kernel without tcx: the
// NodePort program as a legacy tc filter at each device's ingress, recorded
// under the pin directory (needed: the filter outlives the process).
func (lb *LB) syncNodePortFilters(ifindexes []int) (attached, detached []int, err error) {
	if lb.pinDir == "" {
		return nil, nil, errors.New("services: NodePort without a pin directory needs tcx links (Linux 6.6): a legacy tc filter outlives the process")
	}
	if lb.objs.EzSvcNodeport == nil {
		st, _ := lb.parts.Get(parts.NodePort)
		return nil, nil, fmt.Errorf("services: NodePort is off on this kernel: %s", st.Reason)
	}
	if lb.npFilters == nil {
		lb.npFilters = map[int]string{}
	}
	cookie, err := bpfsys.NetNSCookie("")
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, ifx := range ifindexes {
		if _, ok := lb.npFilters[ifx]; ok {
			continue
		}
		f := bpfsys.TCFilter{Ifindex: ifx, Ingress: true, Name: nodePortProg, Prio: npPrio}
		if err := bpfsys.AttachTCFilter(lb.pinDir, cookie, f, lb.objs.EzSvcNodeport); err != nil {
			errs = append(errs, fmt.Errorf("services: NodePort on ifindex %d: %w", ifx, err))
			continue
		}
		lb.npFilters[ifx] = bpfsys.TCRecord(lb.pinDir, cookie, f)
		attached = append(attached, ifx)
	}
	// This process's filters and an earlier agent's records for devices
	// not wanted now.
	recs, err := bpfsys.TCRecords(lb.pinDir)
	if err != nil {
		return attached, nil, errors.Join(append(errs, err)...)
	}
	for _, rec := range recs {
		c, f, err := bpfsys.ParseTCRecord(rec)
		if err != nil || c != cookie || f.Name != nodePortProg || slices.Contains(ifindexes, f.Ifindex) {
			continue
		}
		if err := bpfsys.DetachTCFilter(rec); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, ok := lb.npFilters[f.Ifindex]; ok {
			delete(lb.npFilters, f.Ifindex)
			detached = append(detached, f.Ifindex)
		}
	}
	return attached, detached, errors.Join(errs...)
}

// unpinNodePorts unpins the NodePort links an earlier agent left in every
// network namespace (Unpin), and detaches its legacy tc filters.
func unpinNodePorts(pinDir string) error {
	recs, err := bpfsys.TCRecords(pinDir)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		if _, f, err := bpfsys.ParseTCRecord(rec); err == nil && f.Name == nodePortProg {
			if err := bpfsys.DetachTCFilter(rec); err != nil {
				return err
			}
		}
	}
	pins, err := bpfsys.PinnedLinks(pinDir)
	if err != nil {
		return err
	}
	for _, pin := range pins {
		if !strings.HasPrefix(filepath.Base(pin), nodePortProg+"_") {
			continue
		}
		if err := bpfsys.UnpinLink(pin); err != nil {
			return err
		}
		os.Remove(filepath.Dir(pin))
		os.Remove(filepath.Dir(filepath.Dir(pin)))
	}
	return nil
}
