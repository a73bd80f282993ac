package podnet

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Control is a traffic control another owner set up on a device that a
// redirect of the bridge bypass would skip: a qdisc other than the
// kernel's default (a shaper: the bandwidth CNI plugin's tbf), a tc filter
// or a tcx program that is not eztunnel's. The zero Control is none.
type Control struct {
	Kind string // ControlQdisc, ControlFilter, ControlTCX
	What string // for people: which one, where
}

// The kinds of Control (the reason label of eztunnel_bypass_idle_devices).
const (
	ControlQdisc  = "qdisc"
	ControlFilter = "tc_filter"
	ControlTCX    = "tcx_program"
	// ControlUnreadable: the device's qdiscs, filters or tcx programs
	// could not be listed (it stays idle until they can).
	ControlUnreadable = "tc_unreadable"
)

// String is "<kind>: <what>", or "".
func (c Control) String() string {
	if c.Kind == "" {
		return ""
	}
	return c.Kind + ": " + c.What
}

// ownPrefix: every eBPF program and legacy tc filter eztunnel attaches is
// named ez_* (program names, bpfsys.TCFilter names). Attaching tc programs
// takes CAP_NET_ADMIN in the node's namespace: the name tells eztunnel's
// own apart from another owner's, it guards against nobody.
const ownPrefix = "ez_"

// Controls returns the first Control on device ifindex that the bypass
// would skip, or the zero Control. egress: its transmit side counts too
// (root qdisc, egress filters and tcx programs): a pod's host-side veth,
// into which the bypass delivers with bpf_redirect_peer, skipping that
// veth's whole transmit path. Its receive side always counts: the
// bypass's tcx ingress program runs before classic tc filters
// (sch_handle_ingress: tcx_run, then tc_run) and, appended, after other
// tcx programs, so a redirect skips the filters and the later programs.
//
// A qdisc the kernel attached (handle 0: noqueue on a veth, pfifo_fast,
// fq_codel, mq and its children) shapes nothing and does not count; nor do
// an ingress or clsact qdisc (hooks for filters, which are checked) or
// filters and tcx programs named ez_*. The netlink queries go through h;
// the tcx queries run in the calling thread's network namespace, which
// must be h's.
func Controls(h *netlink.Handle, ifindex int, egress bool) (Control, error) {
	qs, err := h.QdiscList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}})
	if err != nil {
		return Control{}, fmt.Errorf("podnet: qdiscs of ifindex %d: %w", ifindex, err)
	}
	return controls(h, ifindex, egress, qs)
}

// controls is Controls with the qdiscs listed already (of any devices).
func controls(h *netlink.Handle, ifindex int, egress bool, qs []netlink.Qdisc) (Control, error) {
	lk := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
	var parents []uint32
	for _, q := range qs {
		a := q.Attrs()
		if a.LinkIndex != ifindex {
			continue
		}
		switch q.Type() {
		case "ingress":
			parents = append(parents, netlink.HANDLE_MIN_INGRESS)
			continue
		case "clsact":
			parents = append(parents, netlink.HANDLE_MIN_INGRESS)
			if egress {
				parents = append(parents, netlink.HANDLE_MIN_EGRESS)
			}
			continue
		}
		if a.Handle == 0 || !egress {
			continue // the kernel's default; or a transmit qdisc where only receive counts
		}
		return Control{ControlQdisc, fmt.Sprintf("%s %s parent %s on the transmit side (traffic the bypass would deliver past it)", q.Type(), netlink.HandleStr(a.Handle), netlink.HandleStr(a.Parent))}, nil
	}
	for _, parent := range parents {
		fs, err := h.FilterList(lk, parent)
		if err != nil {
			return Control{}, fmt.Errorf("podnet: tc filters of ifindex %d: %w", ifindex, err)
		}
		for _, f := range fs {
			if ownFilter(f) {
				continue
			}
			return Control{ControlFilter, fmt.Sprintf("%s filter prio %d at %s, not eztunnel's", f.Type(), f.Attrs().Priority, hookName(parent))}, nil
		}
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if at == ebpf.AttachTCXEgress && !egress {
			continue
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
		if errors.Is(err, unix.EINVAL) || errors.Is(err, ebpf.ErrNotSupported) {
			break // no tcx before Linux 6.6: nothing attached there
		}
		if err != nil {
			return Control{}, fmt.Errorf("podnet: tcx programs of ifindex %d: %w", ifindex, err)
		}
		for _, p := range res.Programs {
			name := progName(p.ID)
			if strings.HasPrefix(name, ownPrefix) {
				continue
			}
			dir := "ingress"
			if at == ebpf.AttachTCXEgress {
				dir = "egress"
			}
			return Control{ControlTCX, fmt.Sprintf("program %q (id %d) at tcx %s, not eztunnel's", name, p.ID, dir)}, nil
		}
	}
	return Control{}, nil
}

// ownFilter: a cls_bpf filter eztunnel attached (named ez_*, or running
// an ez_* program).
func ownFilter(f netlink.Filter) bool {
	bf, ok := f.(*netlink.BpfFilter)
	if !ok {
		return false
	}
	return strings.HasPrefix(bf.Name, ownPrefix) || (bf.Id > 0 && strings.HasPrefix(progName(ebpf.ProgramID(bf.Id)), ownPrefix))
}

// progName is the kernel's name of program id ("" when it cannot be read).
func progName(id ebpf.ProgramID) string {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return ""
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return ""
	}
	return info.Name
}

func hookName(parent uint32) string {
	if parent == netlink.HANDLE_MIN_EGRESS {
		return "egress"
	}
	return "ingress"
}

// addControls fills in the Control of every port (both sides) and uplink
// (receive side: the bypass sends to an uplink with bpf_redirect, through
// its qdisc) of st, through h in the calling thread's namespace. A device
// whose controls cannot be read gets a ControlUnreadable.
func addControls(h *netlink.Handle, st *State) {
	// One dump of every device's qdiscs (the kernel's qdisc dump does not
	// filter by device).
	qs, qerr := h.QdiscList(nil)
	get := func(ifx int, egress bool) Control {
		if qerr != nil {
			return Control{ControlUnreadable, fmt.Sprintf("podnet: qdiscs: %v", qerr)}
		}
		c, err := controls(h, ifx, egress, qs)
		if err != nil {
			return Control{ControlUnreadable, err.Error()}
		}
		return c
	}
	for ifx, p := range st.Ports {
		p.Control = get(ifx, true)
		st.Ports[ifx] = p
	}
	for ifx, u := range st.Uplinks {
		u.Control = get(ifx, false)
		st.Uplinks[ifx] = u
	}
}
