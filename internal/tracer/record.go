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
	StagePodRX   = Stage(tracerEzTrcStageEZ_TRC_P_RX)
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
		tracerEzTrcStageEZ_TRC_H_XMIT: "h_xmit", tracerEzTrcStageEZ_TRC_P_RX: "p_rx",
		tracerEzTrcStageEZ_TRC_P_RECV: "p_recv", tracerEzTrcStageEZ_TRC_P_TCXI_FIRST: "p_tcxi_first",
		tracerEzTrcStageEZ_TRC_P_TCXI_LAST: "p_tcxi_last", tracerEzTrcStageEZ_TRC_P_NF_PRE: "p_nf_pre",
		tracerEzTrcStageEZ_TRC_P_NF_IN: "p_nf_in", tracerEzTrcStageEZ_TRC_P_NF_FWD: "p_nf_fwd",
		tracerEzTrcStageEZ_TRC_COPY: "copy", tracerEzTrcStageEZ_TRC_FREE: "free",
		tracerEzTrcStageEZ_TRC_P_DONE: "p_xmit_done", tracerEzTrcStageEZ_TRC_H_DONE: "h_xmit_done",
	} {
		n[s] = name
	}
	return n
}()

func (s Stage) String() string { return stageNames[s] }

// MarshalText names the stage in JSON.
func (s Stage) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Host reports whether the stage is seen in the tracer's own namespace.
func (s Stage) Host() bool { return strings.HasPrefix(stageNames[s], "h_") }

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
		Skb: p.Skb, NetNS: p.Netns, LastNS: p.LastNs, SPort: p.Sport, DPort: p.Dport, Proto: p.Proto, Len: p.Len,
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

// NFSlotName names a netfilter slot: side, hook, table.
func NFSlotName(i int) string {
	side := "p"
	if i >= NFSlots/2 {
		side = "h"
	}
	i %= NFSlots / 2
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

// Split divides Total into time in the sending pod, the host and the
// receiving pod: a segment belongs to the side of the stage it ends at.
func (r *Record) Split() (podOut, host, podIn uint64) {
	for _, s := range r.Segments() {
		switch {
		case s.Stage.Host():
			host += s.NS
		case s.Stage < StageHostRX:
			podOut += s.NS
		default:
			podIn += s.NS
		}
	}
	return
}

// NFTotal is the time spent inside netfilter tables.
func (r *Record) NFTotal() uint64 {
	var t uint64
	for _, v := range r.NF {
		t += uint64(v)
	}
	return t
}
