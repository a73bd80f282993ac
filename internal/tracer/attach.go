package tracer

import (
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// tracepoint is one tracepoint with its tp_btf program and raw_tp fallback.
type tracepoint struct {
	name     string
	btf, raw *ebpf.Program
}

func (o *tracerObjects) tracepoints() []tracepoint {
	return []tracepoint{
		{"netif_rx", o.TrcBtfNetifRx, o.TrcRawNetifRx},
		{"napi_gro_receive_entry", o.TrcBtfNapiGroReceiveEntry, o.TrcRawNapiGroReceiveEntry},
		{"netif_receive_skb", o.TrcBtfNetifReceiveSkb, o.TrcRawNetifReceiveSkb},
		{"net_dev_queue", o.TrcBtfNetDevQueue, o.TrcRawNetDevQueue},
		{"net_dev_start_xmit", o.TrcBtfNetDevStartXmit, o.TrcRawNetDevStartXmit},
		{"net_dev_xmit", o.TrcBtfNetDevXmit, o.TrcRawNetDevXmit},
		{"skb_copy_datagram_iovec", o.TrcBtfSkbCopyDatagramIovec, o.TrcRawSkbCopyDatagramIovec},
		{"consume_skb", o.TrcBtfConsumeSkb, o.TrcRawConsumeSkb},
		{"kfree_skb", o.TrcBtfKfreeSkb, o.TrcRawKfreeSkb},
		{"tcp_probe", o.TrcBtfTcpProbe, o.TrcRawTcpProbe},
		{"sk_data_ready", o.TrcBtfSkDataReady, o.TrcRawSkDataReady},
		{"sock_send_length", o.TrcBtfSockSendLength, o.TrcRawSockSendLength},
		{"sock_recv_length", o.TrcBtfSockRecvLength, o.TrcRawSockRecvLength},
	}
}

// attachTracepoints attaches each tracepoint as tp_btf, or raw_tp when
// that fails (or rawOnly). Every link is appended to t.links at once.
func (t *Tracer) attachTracepoints(rawOnly bool) error {
	for _, tp := range t.objs.tracepoints() {
		var l link.Link
		var err error
		kind := "tp_btf"
		if !rawOnly {
			l, err = link.AttachTracing(link.TracingOptions{Program: tp.btf})
		}
		if rawOnly || err != nil {
			if err != nil {
				slog.Debug("tp_btf attach failed, using raw_tp", "tracepoint", tp.name, "err", err)
			}
			kind = "raw_tp"
			l, err = link.AttachRawTracepoint(link.RawTracepointOptions{Name: tp.name, Program: tp.raw})
		}
		if err != nil {
			return fmt.Errorf("attach tracepoint %s: %w", tp.name, err)
		}
		t.links = append(t.links, l)
		t.Attached = append(t.Attached, Attachment{Kind: kind, Where: tp.name, Program: t.progFor(kind, tp)})
	}
	return nil
}

func (t *Tracer) progFor(kind string, tp tracepoint) *ebpf.Program {
	if kind == "raw_tp" {
		return tp.raw
	}
	return tp.btf
}

// attachTCX places the observers first and last on each interface.
func (t *Tracer) attachTCX(ifaces []Iface) error {
	for _, ifc := range ifaces {
		err := bpfsys.InNetNS(ifc.NetNS, func() error {
			lk, err := netlink.LinkByName(ifc.Name)
			if err != nil {
				return fmt.Errorf("interface %s: %w", ifc.Name, err)
			}
			for _, a := range []struct {
				prog   *ebpf.Program
				att    ebpf.AttachType
				anchor link.Anchor
				what   string
			}{
				{t.objs.TrcTcxiFirst, ebpf.AttachTCXIngress, link.Head(), "ingress first"},
				{t.objs.TrcTcxiLast, ebpf.AttachTCXIngress, link.Tail(), "ingress last"},
				{t.objs.TrcTcxeFirst, ebpf.AttachTCXEgress, link.Head(), "egress first"},
				{t.objs.TrcTcxeLast, ebpf.AttachTCXEgress, link.Tail(), "egress last"},
			} {
				l, err := link.AttachTCX(link.TCXOptions{Interface: lk.Attrs().Index, Program: a.prog, Attach: a.att, Anchor: a.anchor})
				if err != nil {
					return fmt.Errorf("tcx %s on %s: %w", a.what, ifc.Name, err)
				}
				t.links = append(t.links, l)
				t.Attached = append(t.Attached, Attachment{Kind: "tcx " + a.what, Where: ifc.String(), Program: a.prog})
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (i Iface) String() string {
	if i.NetNS == "" {
		return i.Name
	}
	return i.NetNS + ":" + i.Name
}

// nfPrograms returns the before/after programs of a table.
func (o *tracerObjects) nfPrograms(t Table) (before, after *ebpf.Program) {
	switch t {
	case TableRaw:
		return o.TrcNfRawBefore, o.TrcNfRawAfter
	case TableConntrack:
		return o.TrcNfConntrackBefore, o.TrcNfConntrackAfter
	case TableMangle:
		return o.TrcNfMangleBefore, o.TrcNfMangleAfter
	case TableDNAT:
		return o.TrcNfDnatBefore, o.TrcNfDnatAfter
	case TableFilter:
		return o.TrcNfFilterBefore, o.TrcNfFilterAfter
	default:
		return o.TrcNfSnatBefore, o.TrcNfSnatAfter
	}
}

// attachNetfilter times every base chain found in each namespace: a link
// one priority below and one above it.
func (t *Tracer) attachNetfilter(namespaces []string) error {
	for _, ns := range namespaces {
		chains, err := BaseChains(ns)
		if err != nil {
			return err
		}
		err = bpfsys.InNetNS(ns, func() error {
			for _, c := range chains {
				before, after := t.objs.nfPrograms(c.Table)
				if err := t.attachNF(ns, c, before, c.Priority-1, -1); err != nil {
					return err
				}
				if err := t.attachNF(ns, c, after, c.Priority+1, +1); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// attachNF attaches prog at prio or the next free priority stepping by step.
func (t *Tracer) attachNF(ns string, c Chain, prog *ebpf.Program, prio, step int32) error {
	l, prio, err := bpfsys.AttachNetfilter(link.NetfilterOptions{Program: prog, ProtocolFamily: c.Family, Hook: c.Hook, Priority: prio}, step, 8)
	if err != nil {
		return fmt.Errorf("netfilter link for %s in %s: %w", c, nsLabel(ns), err)
	}
	t.links = append(t.links, l)
	t.Attached = append(t.Attached, Attachment{Kind: "netfilter", Where: fmt.Sprintf("%s %s prio %d", nsLabel(ns), c, prio), Program: prog})
	return nil
}

func nsLabel(ns string) string {
	if ns == "" {
		return "host"
	}
	return ns
}
