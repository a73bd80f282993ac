package shortcut

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Device is a network device of the agent's namespace that the FINs of
// accelerated connections cross: ez_sc_close_reset is attached to it
// (bpf/shortcut/closereset.h), first in tcx order.
type Device struct {
	Ifindex int
	Name    string
	Ingress bool // what the device receives (a pod's host-side veth: what the pod sends)
	Egress  bool // what it sends (lo; a pod bridge: what this namespace sends to its pods)
}

// resetProg names the close-reset program: its program pin and, with the
// direction, its link pins links/tcx/<netns cookie>/<ifindex>/<resetProg>_<dir>.
const resetProg = shortcutProgEzScCloseReset

// resetFilterName is the name of its legacy tc filters (kernels without tcx)
// and of their records tc/<netns cookie>/<ifindex>/<resetFilterName>_<dir>. It
// is the program's name before the family prefix, and stays so: the
// filter's handle is derived from it (bpfsys.TCFilter), and an upgrade
// replaces a filter's program in place only under the same handle.
const resetFilterName = "ez_close_reset"

type devAttach struct {
	dir    string
	attach ebpf.AttachType
}

var devAttaches = []devAttach{{"ingress", ebpf.AttachTCXIngress}, {"egress", ebpf.AttachTCXEgress}}

// resetLinkPin is the pin of the close reset's tcx link on the device with
// ifindex of the network namespace with cookie, in direction a.
func (s *Shortcut) resetLinkPin(cookie uint64, ifindex int, a devAttach) string {
	return bpfsys.LinkPin(s.dir, bpfsys.KindTCX, strconv.FormatUint(cookie, 10), strconv.Itoa(ifindex), resetProg+"_"+a.dir)
}

// SyncDevices converges the close-reset links of this network namespace to
// devs within tx: links pinned by an earlier agent get this load's program
// in place, missing ones are attached and pinned, and those of devices not
// in devs (removed, or no longer a pod's) are unpinned when tx commits. A
// device that disappears while it is attached fails alone and is reported
// in skipped. It returns the pins it attached and pruned.
func (s *Shortcut) SyncDevices(tx *bpfsys.Tx, devs []Device) (attached, pruned, skipped []string, err error) {
	if s.objs.EzScCloseReset == nil {
		return nil, nil, nil, nil // RST on close is off on this kernel (s.parts)
	}
	cookie, err := bpfsys.NetNSCookie("")
	if err != nil {
		return nil, nil, nil, err
	}
	if !bpfsys.UseTCX() {
		return s.syncDevicesTC(tx, cookie, devs)
	}
	base := bpfsys.LinkPin(s.dir, bpfsys.KindTCX, strconv.FormatUint(cookie, 10))
	want := map[string]bool{}
	for _, d := range devs {
		for _, a := range devAttaches {
			if (a.dir == "ingress" && !d.Ingress) || (a.dir == "egress" && !d.Egress) {
				continue
			}
			pin := s.resetLinkPin(cookie, d.Ifindex, a)
			want[pin] = true
			if _, ok := s.devLinks[pin]; ok {
				continue // this process attached or updated it
			}
			_, err := s.attachDeviceTx(tx, pin, d, a)
			if err != nil {
				if errors.Is(err, errDeviceGone) {
					skipped = append(skipped, d.Name)
					delete(want, pin)
					continue
				}
				return nil, nil, nil, fmt.Errorf("close reset on %s (%s): %w", d.Name, a.dir, err)
			}
			attached = append(attached, pin)
		}
	}
	pins, err := bpfsys.PinnedLinks(s.dir)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, pin := range pins {
		// Only the close reset's pins (other families pin under their own directories).
		if filepath.Dir(filepath.Dir(pin)) != base || want[pin] || !strings.HasPrefix(filepath.Base(pin), resetProg+"_") {
			continue
		}
		pruned = append(pruned, pin)
	}
	for pin := range s.devLinks {
		if strings.HasPrefix(pin, base+"/") && !want[pin] && !slices.Contains(pruned, pin) {
			pruned = append(pruned, pin) // pods' loopbacks are SyncLoopbacks'
		}
	}
	tx.OnCommit(func() error { return s.unpinDevices(pruned) })
	return attached, pruned, skipped, nil
}

var errDeviceGone = errors.New("device gone")

// unpinDevices closes this process's handles on the device links pinned at
// pins and unpins them (detached once nothing holds them), removing their
// ifindex and netns directories once empty.
func (s *Shortcut) unpinDevices(pins []string) error {
	var errs []error
	for _, pin := range pins {
		if l, ok := s.devLinks[pin]; ok {
			errs = append(errs, l.Close())
			delete(s.devLinks, pin)
		}
		errs = append(errs, bpfsys.UnpinLink(pin))
		os.Remove(filepath.Dir(pin))
		os.Remove(filepath.Dir(filepath.Dir(pin)))
	}
	return errors.Join(errs...)
}

// attachDeviceTx is attachDevice recorded in s.devLinks; on rollback the
// link leaves s.devLinks and is closed after its own undo steps (its old
// program back, or unpinned), which need it open.
func (s *Shortcut) attachDeviceTx(tx *bpfsys.Tx, pin string, d Device, a devAttach) (link.Link, error) {
	var l link.Link
	// Registered first, so it runs last.
	tx.OnRollback(func() error {
		if l == nil {
			return nil
		}
		delete(s.devLinks, pin)
		return l.Close()
	})
	l, err := s.attachDevice(tx, pin, d, a)
	if err != nil {
		return nil, err
	}
	s.devLinks[pin] = l
	return l, nil
}

// attachDevice updates the link pinned at pin in place, or attaches a new
// one first in the device's tcx chain and pins it. A pinned link whose
// device went away (ifindex 0 in its info) or is now another device is
// replaced.
func (s *Shortcut) attachDevice(tx *bpfsys.Tx, pin string, d Device, a devAttach) (link.Link, error) {
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		info, ierr := old.Info()
		old.Close()
		if ierr != nil {
			return nil, fmt.Errorf("link info of %s: %w", pin, ierr)
		}
		if tcx := info.TCX(); tcx == nil || int(tcx.Ifindex) != d.Ifindex {
			// Defunct (its device was removed; the ifindex was reused): let it go.
			if err := bpfsys.UnpinLink(pin); err != nil {
				return nil, err
			}
		} else {
			l, ok, err := tx.UpdatePinned(pin, s.objs.EzScCloseReset, s.prevProgs[resetProg])
			if err != nil || ok {
				return l, err
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: d.Ifindex, Program: s.objs.EzScCloseReset, Attach: a.attach, Anchor: link.Head()})
	if err != nil {
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return nil, errDeviceGone
		}
		return nil, fmt.Errorf("attach: %w", err)
	}
	if err := tx.PinLink(l, pin); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Devices lists the devices the close-reset program is attached to in this
// network namespace, by pin (tcx) or record (legacy tc).
func (s *Shortcut) Devices() []string {
	out := make([]string, 0, len(s.devLinks)+len(s.devFilters))
	for pin := range s.devLinks {
		out = append(out, pin)
	}
	for rec := range s.devFilters {
		out = append(out, rec)
	}
	slices.Sort(out)
	return out
}

// resetPrio: the legacy tc priority of ez_sc_close_reset, first on its device
// (tcx: link.Head()).
const resetPrio = 1

func resetFilter(d Device, a devAttach) bpfsys.TCFilter {
	return bpfsys.TCFilter{Ifindex: d.Ifindex, Ingress: a.dir == "ingress", Name: resetFilterName, Prio: resetPrio}
}

// syncDevicesTC is SyncDevices on a kernel without tcx: ez_sc_close_reset as a
// legacy tc filter of each device (bpfsys.AttachTCFilter), recorded under
// <dir>/tc/<netns cookie>.
func (s *Shortcut) syncDevicesTC(tx *bpfsys.Tx, cookie uint64, devs []Device) (attached, pruned, skipped []string, err error) {
	want := map[string]bool{}
	for _, d := range devs {
		for _, a := range devAttaches {
			if (a.dir == "ingress" && !d.Ingress) || (a.dir == "egress" && !d.Egress) {
				continue
			}
			f := resetFilter(d, a)
			rec := bpfsys.TCRecord(s.dir, cookie, f)
			want[rec] = true
			if s.devFilters[rec] {
				continue // this process attached or updated it
			}
			if err := s.attachFilter(tx, cookie, f); err != nil {
				if errors.Is(err, bpfsys.ErrDeviceGone) {
					skipped = append(skipped, d.Name)
					delete(want, rec)
					continue
				}
				return nil, nil, nil, fmt.Errorf("close reset on %s (%s): %w", d.Name, a.dir, err)
			}
			attached = append(attached, rec)
		}
	}
	recs, err := bpfsys.TCRecords(s.dir)
	if err != nil {
		return nil, nil, nil, err
	}
	base := filepath.Join(s.dir, bpfsys.TCDir, strconv.FormatUint(cookie, 10))
	for _, rec := range recs {
		if filepath.Dir(filepath.Dir(rec)) == base && !want[rec] && strings.HasPrefix(filepath.Base(rec), resetFilterName+"_") {
			pruned = append(pruned, rec)
		}
	}
	tx.OnCommit(func() error { return s.detachFilters(pruned) })
	return attached, pruned, skipped, nil
}

// attachFilter attaches ez_sc_close_reset as f in the calling thread's netns
// within tx: an earlier agent's filter gets this load's program in place,
// and gets its own back on rollback.
func (s *Shortcut) attachFilter(tx *bpfsys.Tx, cookie uint64, f bpfsys.TCFilter) error {
	rec := bpfsys.TCRecord(s.dir, cookie, f)
	if err := tx.AttachTCFilter(s.dir, cookie, f, s.objs.EzScCloseReset); err != nil {
		return err
	}
	s.devFilters[rec] = true
	tx.OnRollback(func() error {
		delete(s.devFilters, rec)
		return nil
	})
	return nil
}

// detachFilters detaches the legacy tc filters recorded at recs.
func (s *Shortcut) detachFilters(recs []string) error {
	var errs []error
	for _, rec := range recs {
		delete(s.devFilters, rec)
		errs = append(errs, bpfsys.DetachTCFilter(rec))
	}
	return errors.Join(errs...)
}

// loopbackIfindex is the loopback device's ifindex in every network
// namespace (LOOPBACK_IFINDEX, net/core/dev.c).
const loopbackIfindex = 1

// SyncLoopbacks attaches ez_sc_close_reset at egress of the loopback device of
// each network namespace in nsPaths (nsfs paths: the pods' namespaces, where
// an application and its sidecar talk over loopback) within tx, and unpins
// the links of namespaces that went away (their loopback device went with
// them: the link is defunct). The agent's own namespace is SyncDevices'. A
// namespace that disappears meanwhile is skipped, and so is one the agent
// may not enter (setns needs CAP_SYS_ADMIN): denied counts those.
func (s *Shortcut) SyncLoopbacks(tx *bpfsys.Tx, nsPaths []string) (attached, pruned []string, denied int, err error) {
	if s.objs.EzScCloseReset == nil {
		return nil, nil, 0, nil // RST on close is off on this kernel (s.parts)
	}
	self, err := bpfsys.NetNSCookie("")
	if err != nil {
		return nil, nil, 0, err
	}
	var selfStat unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &selfStat); err != nil {
		return nil, nil, 0, fmt.Errorf("own network namespace: %w", err)
	}
	seen := map[uint64]bool{} // the cookies of the namespaces in nsPaths
	for _, ns := range nsPaths {
		var st unix.Stat_t
		if err := unix.Stat(ns, &st); err != nil || (st.Dev == selfStat.Dev && st.Ino == selfStat.Ino) {
			continue // gone, or the agent's own (SyncDevices')
		}
		var pin string
		err := bpfsys.InNetNSPath(ns, func() error {
			cookie, err := bpfsys.NetNSCookie("")
			if err != nil || cookie == self {
				return err
			}
			lo := Device{Ifindex: loopbackIfindex, Name: "lo", Egress: true}
			seen[cookie] = true
			if !bpfsys.UseTCX() {
				f := resetFilter(lo, devAttaches[1])
				if pin = bpfsys.TCRecord(s.dir, cookie, f); s.devFilters[pin] {
					return nil
				}
				if err := s.attachFilter(tx, cookie, f); err != nil {
					return err
				}
				attached = append(attached, pin)
				return nil
			}
			pin = s.resetLinkPin(cookie, loopbackIfindex, devAttaches[1])
			if _, ok := s.devLinks[pin]; ok {
				return nil
			}
			if _, err := s.attachDeviceTx(tx, pin, lo, devAttaches[1]); err != nil {
				return err
			}
			attached = append(attached, pin)
			return nil
		})
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, errDeviceGone) {
			continue // the namespace went away
		}
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			denied++
			continue
		}
		if err != nil {
			return nil, nil, denied, fmt.Errorf("close reset on the loopback of %s: %w", ns, err)
		}
	}
	// Legacy tc records of namespaces not seen now: gone, or no longer the
	// pods' (DetachTCFilter enters one that still exists).
	recs, err := bpfsys.TCRecords(s.dir)
	if err != nil {
		return nil, nil, denied, err
	}
	var gone []string
	for _, rec := range recs {
		if c, f, err := bpfsys.ParseTCRecord(rec); err == nil && c != self && !seen[c] && f.Name == resetFilterName {
			gone = append(gone, rec)
		}
	}
	tx.OnCommit(func() error { return s.detachFilters(gone) })
	pruned = append(pruned, gone...)
	pins, err := bpfsys.PinnedLinks(s.dir)
	if err != nil {
		return nil, nil, denied, err
	}
	selfDir := bpfsys.LinkPin(s.dir, bpfsys.KindTCX, strconv.FormatUint(self, 10))
	for _, pin := range pins {
		rel, err := filepath.Rel(bpfsys.LinkPin(s.dir, bpfsys.KindTCX), pin)
		if err != nil || strings.HasPrefix(rel, "..") || strings.HasPrefix(pin, selfDir+"/") {
			continue
		}
		if alive, err := tcxAlive(pin); err != nil {
			return nil, nil, denied, err
		} else if !alive {
			pruned = append(pruned, pin)
		}
	}
	tx.OnCommit(func() error { return s.unpinDevices(pruned) })
	return attached, pruned, denied, nil
}

// tcxAlive tells whether the tcx link pinned at pin is still attached to a
// device.
func tcxAlive(pin string) (bool, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return false, fmt.Errorf("link info of %s: %w", pin, err)
	}
	tcx := info.TCX()
	return tcx != nil && tcx.Ifindex != 0, nil
}
