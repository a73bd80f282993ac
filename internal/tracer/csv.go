package tracer

import (
	"encoding/csv"
	"io"
	"strconv"
)

// CSVWriter writes one row per packet: identity, flow tuple, interfaces,
// CPUs, a column per stage timestamp (ns, monotonic; empty if not seen),
// total and the netfilter time per (side, hook, table).
type CSVWriter struct {
	w   *csv.Writer
	row []string
}

// NewCSVWriter writes the header at once.
func NewCSVWriter(w io.Writer) (*CSVWriter, error) {
	c := &CSVWriter{w: csv.NewWriter(w)}
	return c, c.w.Write(CSVHeader())
}

// CSVHeader is the first row.
func CSVHeader() []string {
	h := []string{"skb", "netns", "end", "drop_reason", "proto", "src", "sport", "dst", "dport", "len",
		"first_ifindex", "last_ifindex", "first_cpu", "last_cpu", "total_ns"}
	for s := Stage(0); s < StageCount; s++ {
		h = append(h, "ts_"+s.String())
	}
	for i := 0; i < NFSlots; i++ {
		h = append(h, "nf_"+NFSlotName(i)+"_ns")
	}
	return h
}

// Write appends one record.
func (c *CSVWriter) Write(r *Record) error {
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	c.row = append(c.row[:0], "0x"+strconv.FormatUint(r.Skb, 16), u(r.NetNS), r.End.String(), u(uint64(r.DropReason)),
		ProtoName(r.Proto), r.Src.String(), u(uint64(r.SPort)), r.Dst.String(), u(uint64(r.DPort)), u(uint64(r.Len)),
		u(uint64(r.FirstIf)), u(uint64(r.LastIf)), u(uint64(r.FirstCPU)), u(uint64(r.LastCPU)), u(r.Total()))
	for _, ts := range r.TS {
		if ts == 0 {
			c.row = append(c.row, "")
		} else {
			c.row = append(c.row, u(ts))
		}
	}
	for _, v := range r.NF {
		c.row = append(c.row, u(uint64(v)))
	}
	return c.w.Write(c.row)
}

// Flush writes buffered rows and reports any write error.
func (c *CSVWriter) Flush() error {
	c.w.Flush()
	return c.w.Error()
}

// ProtoName names an IP protocol number.
func ProtoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 1:
		return "icmp"
	case 58:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}
