package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/podnet"
	"github.com/eztunnel/eztunnel/internal/rtnl"
)

// closeResetDevices lists the devices of this network namespace that FINs of
// accelerated connections cross, for the RST on close (shortcut.Device):
// the loopback device (egress: both ends are here), each pod's host-side
// veth from podnet (ingress: what the pod sends) and the bridges they are
// ports of (egress: what this namespace sends to a pod). A FIN that a
// process of this namespace sends to a pod leaves through the bridge
// device (__dev_queue_xmit runs the bridge's tcx egress before
// br_dev_xmit) and then its veth; one pod's FIN to another is forwarded
// from port to port (br_forward) and never passes the bridge device's
// egress, so pod-to-pod traffic meets the program once, at the sender's
// veth, instead of at both veths.
//
// With cov (--close-reset-devices=covered) only the devices a covered
// namespace's packets leave it by: loopback and bridges when this
// namespace is covered, a pod's veth when its namespace is; and, where the
// program is pinned already, those of a namespace that still has an end in
// the sockhash (its processes left the cgroups, or its pod was
// deselected): such a connection keeps its RST on close, and the device
// goes at the first sync after its last one closed.
func closeResetDevices(st podnet.State, cov *coverage) ([]shortcut.Device, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	bridges := st.Bridges()
	self := cov == nil || cov.self || (cov.keepSelf && cov.pinned(loopbackIfindex, false))
	var devs []shortcut.Device
	for _, l := range links {
		a := l.Attrs()
		if self && (a.Flags&net.FlagLoopback != 0 || bridges[a.Index]) {
			devs = append(devs, shortcut.Device{Ifindex: a.Index, Name: a.Name, Egress: true})
		}
	}
	for _, p := range st.Ports {
		if cov == nil || cov.nsids[p.NetNsID] || ((cov.sticky || cov.keep[p.NetNsID]) && cov.pinned(p.Ifindex, true)) {
			devs = append(devs, shortcut.Device{Ifindex: p.Ifindex, Name: p.Name, Ingress: true})
		}
	}
	slices.SortFunc(devs, func(a, b shortcut.Device) int { return a.Ifindex - b.Ifindex })
	return devs, nil
}

// loopbackIfindex is the loopback device's ifindex in every network
// namespace (LOOPBACK_IFINDEX, net/core/dev.c).
const loopbackIfindex = 1

// coverage is what --close-reset-devices=covered attaches the close reset
// for (closeResetDevices): the namespaces that processes of the coverage
// cgroups live in (plain mode: the managed cgroups; Kubernetes mode: the
// selected pods'), this one (self) and the pods' by the id this namespace
// has for them (podnet.Port.NetNsID); and, among the managed cgroups'
// other namespaces, those with an end in the sockhash (keep, keepSelf).
type coverage struct {
	self, keepSelf bool
	nsids, keep    map[int]bool
	// sticky keeps every pinned device: before the agent's first scan,
	// which it makes at once (the install's attachments stay until then).
	sticky bool
	pinned func(ifindex int, ingress bool) bool // the close reset is pinned there already
}

// coverageOf is the coverage of the namespaces of the coverage cgroups'
// processes (covered) among those of the managed cgroups' (managed).
func coverageOf(sc *shortcut.Shortcut, covered, managed podnet.Namespaces) (*coverage, error) {
	pinned, err := pinnedHere(sc)
	if err != nil {
		return nil, err
	}
	enrolled, err := sc.EnrolledNetNS()
	if err != nil {
		return nil, err
	}
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return nil, fmt.Errorf("own network namespace: %w", err)
	}
	cov := &coverage{self: covered.Self, keepSelf: enrolled[uint32(self.Ino)], nsids: map[int]bool{}, keep: map[int]bool{}, pinned: pinned}
	for _, p := range covered.Others {
		if id, err := netNsID(p); err != nil {
			return nil, err
		} else if id >= 0 {
			cov.nsids[id] = true
		}
	}
	for _, p := range managed.Others {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil || !enrolled[uint32(st.Ino)] {
			continue // gone, or no end in the sockhash
		}
		if id, err := netNsID(p); err != nil {
			return nil, err
		} else if id >= 0 {
			cov.keep[id] = true
		}
	}
	return cov, nil
}

// stickyCoverage covers nothing and keeps every pinned device: the
// coverage before the agent's first scan.
func stickyCoverage(sc *shortcut.Shortcut) (*coverage, error) {
	pinned, err := pinnedHere(sc)
	if err != nil {
		return nil, err
	}
	return &coverage{sticky: true, pinned: pinned}, nil
}

// pinnedHere tells whether the close reset is pinned on a device of this
// network namespace (shortcut.PinnedDevice).
func pinnedHere(sc *shortcut.Shortcut) (func(ifindex int, ingress bool) bool, error) {
	cookie, err := bpfsys.NetNSCookie("")
	if err != nil {
		return nil, err
	}
	return func(ifindex int, ingress bool) bool { return sc.PinnedDevice(cookie, ifindex, ingress) }, nil
}

// netNsID is podnet.NetNsID, -1 for a namespace whose process exited.
func netNsID(p string) (int, error) {
	id, err := podnet.NetNsID(p)
	if errors.Is(err, os.ErrNotExist) {
		return -1, nil
	}
	return id, err
}

// resetPlan is what the close reset converges to: the namespaces whose
// loopback it attaches to (nsfs paths, this one first: those of the
// processes of cover) and, from st, this namespace's devices
// (closeResetDevices; with --close-reset-devices=covered, managed are the
// cgroups whose namespaces may still hold enrolled ends).
func resetPlan(sc *shortcut.Shortcut, st podnet.State, cover, managed []string) (p plan, err error) {
	ns, err := podnet.CgroupNetNamespaces(cover)
	if err != nil {
		return p, err
	}
	if sc.CoveredOnly() {
		m := ns
		if !slices.Equal(cover, managed) {
			if m, err = podnet.CgroupNetNamespaces(managed); err != nil {
				return p, err
			}
		}
		if p.cov, err = coverageOf(sc, ns, m); err != nil {
			return p, err
		}
	}
	p.devs, err = closeResetDevices(st, p.cov)
	p.nss, p.denied = append([]string{"/proc/self/ns/net"}, ns.Others...), ns.Denied
	return p, err
}

// plan is resetPlan's result.
type plan struct {
	devs   []shortcut.Device
	nss    []string  // nsfs paths, this namespace's first
	cov    *coverage // nil: every device (not --close-reset-devices=covered)
	denied int       // processes whose namespace the agent may not open
}

// scanState is a fresh podnet scan.
func scanState() (podnet.State, error) {
	h, err := rtnl.Route()
	if err != nil {
		return podnet.State{}, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	return podnet.Scan(h)
}

// SyncDevices converges the RST-on-close device links to the loopback device,
// the pods' veths and their bridges of st (the agent's podnet watch), as one transaction.
func (d *Datapath) SyncDevices(st podnet.State) error {
	d.pods, d.havePods = st, true
	if d.sc.CoveredOnly() && d.cov == nil {
		// Before the first SyncLoopbacks: what Install covered is pinned.
		cov, err := stickyCoverage(d.sc)
		if err != nil {
			return err
		}
		d.cov = cov
	}
	devs, err := closeResetDevices(st, d.cov)
	if err != nil {
		return err
	}
	var attached, pruned, skipped []string
	if err := bpfsys.RunTx(func(tx *bpfsys.Tx) (err error) {
		attached, pruned, skipped, err = d.sc.SyncDevices(tx, devs)
		return err
	}); err != nil {
		return err
	}
	if err := d.sc.SyncCoverage(); err != nil {
		return err
	}
	if len(attached)+len(pruned)+len(skipped) > 0 {
		slog.Info("RST-on-close devices converged", "attached", len(attached), "detached", len(pruned), "gone", skipped, "devices", len(d.sc.Devices()))
	}
	return nil
}

// CoverageWanted are the network namespaces whose first handshakes found
// their loopback without the RST on close since the last call
// (shortcut.CoverageWanted): SyncLoopbacks covers them, if the managed
// cgroups' processes still live there.
func (d *Datapath) CoverageWanted() ([]uint64, error) { return d.sc.CoverageWanted() }

// SyncLoopbacks attaches the RST on close to the loopback device of every
// network namespace a process of the cgroups lives in (an application and
// its sidecar talk over it), and detaches it from namespaces that went away,
// as one transaction. With --close-reset-devices=covered the cgroups also
// say which of this namespace's devices carry it (closeResetDevices, with
// the ends the managed cgroups' namespaces still have in the sockhash), in
// the same transaction, once SyncDevices has told the pods' devices. denied
// counts processes whose namespace the agent may not open (Kubernetes
// without hostPID).
func (d *Datapath) SyncLoopbacks(cgroups []string) (denied int, err error) {
	p, err := resetPlan(d.sc, d.pods, cgroups, d.managed)
	if err != nil {
		return p.denied, err
	}
	denied = p.denied
	if p.cov != nil {
		d.cov = p.cov
	}
	syncDevs := d.sc.CoveredOnly() && d.havePods
	var attached, pruned, devAttached, devPruned []string
	err = bpfsys.RunTx(func(tx *bpfsys.Tx) (err error) {
		if syncDevs {
			if devAttached, devPruned, _, err = d.sc.SyncDevices(tx, p.devs); err != nil {
				return err
			}
		}
		var n int
		attached, pruned, n, err = d.sc.SyncLoopbacks(tx, p.nss)
		denied += n
		return err
	})
	if err != nil {
		return denied, err
	}
	if err := d.sc.SyncCoverage(); err != nil {
		return denied, err
	}
	if len(attached)+len(pruned) > 0 {
		slog.Info("RST-on-close pod loopbacks converged", "attached", len(attached), "detached", len(pruned))
	}
	if len(devAttached)+len(devPruned) > 0 {
		slog.Info("RST-on-close devices of the covered namespaces converged", "attached", len(devAttached), "detached", len(devPruned))
	}
	return denied, nil
}

// CoveredOnly tells whether sockets enrol only in network namespaces whose
// devices carry the close reset (--close-reset-devices=covered, where the
// close reset runs).
func (d *Datapath) CoveredOnly() bool { return d.sc.CoveredOnly() }
