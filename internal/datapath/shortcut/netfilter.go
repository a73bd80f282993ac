package shortcut

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// natPriority places ez_sc_nat after every NAT of POST_ROUTING
// (NF_IP_PRI_NAT_SRC is 100), so conntrack holds the final translation.
// Another datapath in this namespace (or the one being replaced) holds a
// priority already: the next free one is taken, up to natPriorityLast.
const (
	natPriority     = 101
	natPriorityLast = 131
)

var natFamilies = []struct {
	name   string
	family link.NetfilterProtocolFamily
}{{"ipv4", link.NetfilterProtoIPv4}, {"ipv6", link.NetfilterProtoIPv6}}

// attachNAT attaches the NAT learner this load has (natGroup) in the calling
// process's network namespace (the node's, for the agent): it learns NAT
// that this namespace applies to traffic between pods (kube-proxy DNAT).
// ez_sc_nat_ct and ez_sc_nat_dev are tracing links (attachNATTracing);
// ez_sc_nat is a netfilter link for IPv4 and one for IPv6 at POST_ROUTING.
// Links cannot be updated in place: the new link is attached next to a
// pinned one of an earlier install, which is detached on commit or kept on
// rollback, and so is an earlier install's link on another hook (an
// upgrade to a build, or onto a host, where the fentry loads). Meanwhile
// both run: the second finds the alias the first wrote (BPF_NOEXIST) with
// the same target and changes nothing.
func (s *Shortcut) attachNAT(tx *bpfsys.Tx) error {
	var keep []string
	defer func() { s.dropOtherNAT(tx, keep) }()
	switch {
	case s.objs.EzScNatCt != nil:
		keep = []string{bpfsys.LinkPin(s.dir, bpfsys.KindTracing, shortcutProgEzScNatCt)}
		return s.attachNATTracing(tx, s.objs.EzScNatCt, shortcutProgEzScNatCt, "fentry/"+confirmFunc)
	case s.objs.EzScNatDev != nil:
		keep = []string{bpfsys.LinkPin(s.dir, bpfsys.KindTracing, shortcutProgEzScNatDev)}
		return s.attachNATTracing(tx, s.objs.EzScNatDev, shortcutProgEzScNatDev, "tp_btf/net_dev_queue")
	case s.objs.EzScNat == nil:
		// ez_sc_close_reset learns at SYN-ACKs (natTC: no NAT hook), or
		// pairing under NAT is off on this kernel (s.parts): NAT-ed
		// connections stay on the kernel path. An earlier install's NAT
		// hook is detached at commit either way.
		return nil
	}
	for _, f := range natFamilies {
		pin := bpfsys.LinkPin(s.dir, bpfsys.KindNetfilter, shortcutProgEzScNat+"_"+f.name)
		keep = append(keep, pin)
		old, err := link.LoadPinnedLink(pin, nil)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("open pinned link %s: %w", pin, err)
		}
		l, _, err := bpfsys.AttachNetfilter(link.NetfilterOptions{
			Program:        s.objs.EzScNat,
			ProtocolFamily: f.family,
			Hook:           link.NetfilterInetPostRouting,
			Priority:       natPriority,
		}, +1, natPriorityLast-natPriority+1)
		if err != nil {
			if old != nil {
				old.Close()
			}
			return fmt.Errorf("attach netfilter %s POST_ROUTING: %w", f.name, err)
		}
		s.links = append(s.links, l)
		if err := pinOver(tx, l, old, pin); err != nil {
			return err
		}
	}
	return nil
}

// attachRecv attaches the read counter this load has (readGroup):
// ez_sc_recv_fx to fexit/tcp_bpf_recvmsg, or ez_sc_recv to
// tp_btf/sock_recv_length. Tracing links cannot be updated in place: over
// an earlier install (which may count with the other hook) the new link
// runs next to the pinned one until commit, and exactly one of them counts
// reads (the ez_sc_control owner slot, bpf/shortcut/recv.h): the old one
// until commit moves the slot to this load, then the old link is detached.
func (s *Shortcut) attachRecv(tx *bpfsys.Tx) error {
	prog, name, hook := s.objs.EzScRecvFx, shortcutProgEzScRecvFx, "fexit/"+recvFunc
	if prog == nil {
		prog, name, hook = s.objs.EzScRecv, shortcutProgEzScRecv, "tp_btf/sock_recv_length"
	}
	if prog == nil {
		return nil // reads are gauged, not counted, on this kernel (rxGauge)
	}
	pin := bpfsys.LinkPin(s.dir, bpfsys.KindTracing, name)
	olds := map[string]link.Link{} // by pin
	closeOlds := func() {
		for _, o := range olds {
			o.Close()
		}
	}
	for _, n := range []string{shortcutProgEzScRecvFx, shortcutProgEzScRecv} {
		p := bpfsys.LinkPin(s.dir, bpfsys.KindTracing, n)
		o, err := link.LoadPinnedLink(p, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			closeOlds()
			return fmt.Errorf("open pinned link %s: %w", p, err)
		}
		olds[p] = o
	}
	owner := uint32(shortcutEzControlEZ_CTL_RECV_OWNER)
	setOwner := func(v uint32) error {
		if err := s.objs.EzScControl.Put(owner, v); err != nil {
			return fmt.Errorf("set the counting %s: %w", name, err)
		}
		return nil
	}
	if len(olds) == 0 {
		// Nothing counts reads yet: this one counts from its first.
		var prev uint32
		if err := s.objs.EzScControl.Lookup(owner, &prev); err != nil {
			return fmt.Errorf("read the counting %s: %w", name, err)
		}
		if err := setOwner(s.instance); err != nil {
			return err
		}
		tx.OnRollback(func() error { return setOwner(prev) })
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		closeOlds()
		return fmt.Errorf("attach %s to %s: %w", name, hook, err)
	}
	s.links = append(s.links, l)
	if len(olds) > 0 {
		tx.OnCommit(func() error { return setOwner(s.instance) })
	}
	// The other hook's old link: unpinned at commit, detached when done.
	for p, o := range olds {
		if p != pin {
			tx.OnCommit(func() error { return os.Remove(p) })
			tx.OnDone(o.Close)
		}
	}
	return pinOver(tx, l, olds[pin], pin)
}

// attachNATTracing attaches prog (ez_sc_nat_ct or ez_sc_nat_dev) to its
// hook. Over an earlier install's link on the same hook the new one runs
// next to the pinned one until commit (both write the same aliases,
// BPF_NOEXIST), then the old one is detached.
func (s *Shortcut) attachNATTracing(tx *bpfsys.Tx, prog *ebpf.Program, name, hook string) error {
	pin := bpfsys.LinkPin(s.dir, bpfsys.KindTracing, name)
	old, err := link.LoadPinnedLink(pin, nil)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		if old != nil {
			old.Close()
		}
		return fmt.Errorf("attach %s to %s: %w", name, hook, err)
	}
	s.links = append(s.links, l)
	return pinOver(tx, l, old, pin)
}

// natPins are the link pins of every NAT learner an install may have left.
func (s *Shortcut) natPins() []string {
	pins := []string{bpfsys.LinkPin(s.dir, bpfsys.KindTracing, shortcutProgEzScNatCt), bpfsys.LinkPin(s.dir, bpfsys.KindTracing, shortcutProgEzScNatDev)}
	for _, f := range natFamilies {
		pins = append(pins, bpfsys.LinkPin(s.dir, bpfsys.KindNetfilter, shortcutProgEzScNat+"_"+f.name))
	}
	return pins
}

// dropOtherNAT unpins, when tx commits, the NAT learners an earlier install
// pinned on a hook other than this load's (keep), and detaches them when tx
// is done; on rollback they stay. Until then both learn, as above.
func (s *Shortcut) dropOtherNAT(tx *bpfsys.Tx, keep []string) {
	for _, p := range s.natPins() {
		if slices.Contains(keep, p) {
			continue
		}
		o, err := link.LoadPinnedLink(p, nil)
		if err != nil {
			continue // none (or not a link we can open: uninstall removes it)
		}
		tx.OnCommit(func() error { return os.Remove(p) })
		tx.OnDone(o.Close)
	}
}

// pinOver pins l within tx at pin, where old (nil: none) is the link an
// earlier install pinned and l runs beside until commit: l is pinned at
// pin_next and renamed over pin on commit, which drops old's pin; old is
// closed when tx ends, which detaches it unless rollback kept its pin.
func pinOver(tx *bpfsys.Tx, l, old link.Link, pin string) error {
	if old == nil {
		return tx.PinLink(l, pin)
	}
	tx.OnDone(old.Close)
	next := pin + "_next"
	if err := tx.PinLink(l, next); err != nil {
		return err
	}
	tx.OnCommit(func() error { return os.Rename(next, pin) })
	return nil
}
