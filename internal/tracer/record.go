package tracer

import (
	"net/netip"
	"strings"
)

// Stage is a point on the packet path (enum ez_trc_stage in bpf/tracer/tracer.h).
type Stage uint8

// Stages in path order; those from StageOrdered on never order a lifetime.
const (
	StageCount   = Stage(tracerEzTrcStageEZ_TRC_STAGES)
	StageOrdered = Stage(tracerEzTrcStageEZ_TRC_ORDERED)
	StageHostRX  = Stage(tracerEzTrcStageEZ_TRC_H_RX)
	StageHost2RX = Stage(tracerEzTrcStageEZ_TRC_H2RX)
	StagePodRX   = Stage(tracerEzTrcStageEZ_TRC_P_RX)
	StageSock    = Stage(tracerEzTrcStageEZ_TRC_SOCK)
	StageCopy    = Stage(tracerEzTrcStageEZ_TRC_COPY)
	StageFree    = Stage(tracerEzTrcStageEZ_TRC_FREE)
)

var stageNames = func() [StageCount]string {
	var n [StageCount]string
	for s, name := range map[tracerEzTrcStage]string{
		tracerEzTrcStageEZ_TRC_P_NF_OUT: "p_nf_out", tracerEzTrcStageEZ_TRC_P_NF_POST: "p_nf_post",
		tracerEzTrcStageEZ_TRC_P_QUEUE: "p_queue", tracerEzTrcStageEZ_TRC_P_TCXE_FIRST: "p_tcxe_first",
		tracerEzTrcStageEZ_TRC_P_TCXE_LAST: "p_tcxe_last", tracerEzTrcStageEZ_TRC_P_XMIT: "p_xmit",
		tracerEzTrcStageEZ_TRC_H_RX: "h_rx", tracerEzTrcStageEZ_TRC_H_RECV: "h_recv",
		tracerEzTrcStageEZ_TRC_H_TCXI_FIRST: "h_tcxi_first", tracerEzTrcStageEZ_TRC_H_TCXI_LAST: "h_tcxi_last",
		tracerEzTrcStageEZ_TRC_H_NF_PRE: "h_nf_pre", tracerEzTrcStageEZ_TRC_H_NF_IN: "h_nf_in",
		tracerEzTrcStageEZ_TRC_H_NF_FWD: "h_nf_fwd", tracerEzTrcStageEZ_TRC_H_NF_OUT: "h_nf_out",
		tracerEzTrcStageEZ_TRC_H_NF_POST: "h_nf_post", tracerEzTrcStageEZ_TRC_H_QUEUE: "h_queue",
		tracerEzTrcStageEZ_TRC_H_TCXE_FIRST: "h_tcxe_first", tracerEzTrcStageEZ_TRC_H_TCXE_LAST: "h_tcxe_last",
		tracerEzTrcStageEZ_TRC_H_XMIT: "h_xmit",
		tracerEzTrcStageEZ_TRC_H2RX:   "h2_rx", tracerEzTrcStageEZ_TRC_H2RECV: "h2_recv",
		tracerEzTrcStageEZ_TRC_H2TCXI_FIRST: "h2_tcxi_first", tracerEzTrcStageEZ_TRC_H2TCXI_LAST: "h2_tcxi_last",
		tracerEzTrcStageEZ_TRC_H2NF_PRE: "h2_nf_pre", tracerEzTrcStageEZ_TRC_H2NF_IN: "h2_nf_in",
		tracerEzTrcStageEZ_TRC_H2NF_FWD: "h2_nf_fwd", tracerEzTrcStageEZ_TRC_H2NF_OUT: "h2_nf_out",
		tracerEzTrcStageEZ_TRC_H2NF_POST: "h2_nf_post", tracerEzTrcStageEZ_TRC_H2QUEUE: "h2_queue",
		tracerEzTrcStageEZ_TRC_H2TCXE_FIRST: "h2_tcxe_first", tracerEzTrcStageEZ_TRC_H2TCXE_LAST: "h2_tcxe_last",
		tracerEzTrcStageEZ_TRC_H2XMIT: "h2_xmit", tracerEzTrcStageEZ_TRC_P_RX: "p_rx",
		tracerEzTrcStageEZ_TRC_P_RECV: "p_recv", tracerEzTrcStageEZ_TRC_P_TCXI_FIRST: "p_tcxi_first",
		tracerEzTrcStageEZ_TRC_P_TCXI_LAST: "p_tcxi_last", tracerEzTrcStageEZ_TRC_P_NF_PRE: "p_nf_pre",
		tracerEzTrcStageEZ_TRC_P_NF_IN: "p_nf_in", tracerEzTrcStageEZ_TRC_P_NF_FWD: "p_nf_fwd",
		tracerEzTrcStageEZ_TRC_SOCK: "sock", tracerEzTrcStageEZ_TRC_COPY: "copy", tracerEzTrcStageEZ_TRC_FREE: "free",
		tracerEzTrcStageEZ_TRC_P_DONE: "p_xmit_done", tracerEzTrcStageEZ_TRC_H_DONE: "h_xmit_done",
		tracerEzTrcStageEZ_TRC_H2DONE: "h2_xmit_done",
	} {
		n[s] = name
	}
	return n
}()

func (s Stage) String() string { return stageNames[s] }

// MarshalText names the stage in JSON.
func (s Stage) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Host reports whether the stage is seen in a host namespace: the tracer's
// own or one of Config.HostNetNS (the first or the second host the lifetime
// crossed).
func (s Stage) Host() bool { return strings.HasPrefix(stageNames[s], "h") }

// Host2 reports whether the stage is seen in a second host namespace (the
// receiving node of a cross-node packet).
func (s Stage) Host2() bool { return strings.HasPrefix(stageNames[s], "h2_") }

// End says why a lifetime was emitted (enum ez_trc_end).
type End uint8

// endNames is indexed by enum ez_trc_end; init checks every end is named.
var endNames = [tracerEzTrcEndEZ_TRC_ENDS]string{
	tracerEzTrcEndEZ_TRC_END_FREE: "free", tracerEzTrcEndEZ_TRC_END_DROP: "drop",
	tracerEzTrcEndEZ_TRC_END_REUSED: "reused", tracerEzTrcEndEZ_TRC_END_AGED: "aged",
	tracerEzTrcEndEZ_TRC_END_EVICTED: "evicted", tracerEzTrcEndEZ_TRC_END_OPEN: "open",
}

func (e End) String() string {
	if int(e) < len(endNames) {
		return endNames[e]
	}
	return "unknown"
}

const (
	EndEvicted = End(tracerEzTrcEndEZ_TRC_END_EVICTED)
	EndOpen    = End(tracerEzTrcEndEZ_TRC_END_OPEN)
)

// NFSlots is the number of netfilter (side, hook, table) durations: the
// length of ez_trc_pkt.nf_ns, so Record.NF has exactly its type.
const NFSlots = len(tracerEzTrcPkt{}.NfNs)

// Record is one packet lifetime.
type Record struct {
	Skb        uint64
	NetNS      uint64 // cookie where it started
	Host1      uint64 // cookie of the first host namespace seen (0: none)
	LastNS     uint64 // latest time seen, ordered stage or netfilter exit
	TS         [StageCount]uint64
	NF         [NFSlots]uint32 // ns inside (side, hook, table); see NFSlotName
	Src, Dst   netip.Addr
	SPort      uint16
	DPort      uint16
	Proto      uint8
	Len        uint32
	FirstIf    uint32
	LastIf     uint32
	FirstCPU   uint32
	LastCPU    uint32
	End        End
	DropReason uint32
}

func fromPkt(p *tracerEzTrcPkt) Record {
	r := Record{
		Skb: p.Skb, NetNS: p.Netns, Host1: p.Host1, LastNS: p.LastNs, SPort: p.Sport, DPort: p.Dport, Proto: p.Proto, Len: p.Len,
		FirstIf: p.FirstIfindex, LastIf: p.LastIfindex, FirstCPU: p.FirstCpu, LastCPU: p.LastCpu,
		End: End(p.End), DropReason: p.DropReason,
	}
	r.TS = p.Ts
	r.NF = p.NfNs
	r.Src, r.Dst = addr(p.Family, p.Saddr), addr(p.Family, p.Daddr)
	return r
}

func addr(family uint8, w [4]uint32) netip.Addr {
	var b [16]byte
	for i, v := range w {
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	}
	if family == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// nfSides names the sides of the netfilter slots, in slot order.
var nfSides = [tracerEzTrcNfEZ_TRC_SIDES]string{"p", "h", "h2"}

// NFSlotName names a netfilter slot: side, hook, table.
func NFSlotName(i int) string {
	per := NFSlots / len(nfSides)
	side := nfSides[i/per]
	i %= per
	return side + "_" + hookNames[i/tableCount] + "_" + Table(i%tableCount).String()
}

// Stages returns the ordered stages present, in path order.
func (r *Record) Stages() []Stage {
	var s []Stage
	for i := Stage(0); i < StageOrdered; i++ {
		if r.TS[i] != 0 {
			s = append(s, i)
		}
	}
	return s
}

// Segment is the time from the previous present stage to Stage.
type Segment struct {
	Stage Stage
	NS    uint64
}

// Segments returns the time between consecutive present stages
// (bpf_ktime_get_ns is one monotonic clock for all CPUs; a negative step,
// which would be a bug, counts 0). Their sum never exceeds Total.
func (r *Record) Segments() []Segment {
	st := r.Stages()
	var seg []Segment
	for i := 1; i < len(st); i++ {
		a, b := r.TS[st[i-1]], r.TS[st[i]]
		var d uint64
		if b > a {
			d = b - a
		}
		seg = append(seg, Segment{Stage: st[i], NS: d})
	}
	return seg
}

// Total is the time from the first present stage to the last time the
// lifetime was seen (a stage, or leaving a netfilter table).
func (r *Record) Total() uint64 {
	st := r.Stages()
	if len(st) == 0 {
		return 0
	}
	first, last := r.TS[st[0]], r.TS[st[len(st)-1]]
	if r.LastNS > last {
		last = r.LastNS
	}
	return last - first
}

// Split divides Total into time in the sending pod, the host (both hosts,
// and the wire between them) and the receiving pod: a segment belongs to
// the side of the stage it ends at.
func (r *Record) Split() (podOut, host, podIn uint64) {
	p := r.Parts()
	return p.PodOut, p.Host + p.Wire + p.Host2, p.PodIn
}

// Parts is a lifetime's time by namespace, in ns. Each interval between two
// consecutive stages belongs to the namespace of the later stage, so the
// crossing of a veth is charged to the namespace it enters, and the parts
// add up to the time from the first to the last stage.
type Parts struct {
	PodOut uint64 // the sending pod
	Host   uint64 // the first host (the sending pod's node)
	Wire   uint64 // from the first host's last stage to the second host's first (untraced namespaces between them)
	Host2  uint64 // the second host (the receiving pod's node, cross-node)
	PodIn  uint64 // the receiving pod, up to the application's read or the free
}

// Parts splits the lifetime by namespace (see Parts).
func (r *Record) Parts() (p Parts) {
	st := r.Stages()
	for i, s := range r.Segments() {
		prev := st[i] // the segment runs from st[i] to s.Stage
		switch {
		case s.Stage.Host2() && !prev.Host2() && prev.Host():
			p.Wire += s.NS
		case s.Stage.Host2():
			p.Host2 += s.NS
		case s.Stage.Host():
			p.Host += s.NS
		case s.Stage < StageHostRX:
			p.PodOut += s.NS
		default:
			p.PodIn += s.NS
		}
	}
	return p
}
