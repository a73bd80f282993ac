package tracer

import (
	"bytes"
	"encoding/csv"
	"math"
	"strings"
	"testing"
)

// rec builds a pod-to-pod record: stage -> ns.
func rec(ts map[Stage]uint64) Record {
	var r Record
	for s, v := range ts {
		r.TS[s] = v
		if v > r.LastNS {
			r.LastNS = v
		}
	}
	return r
}

var (
	pQueue = Stage(tracerEzTrcStageEZ_TRC_P_QUEUE)
	hRX    = Stage(tracerEzTrcStageEZ_TRC_H_RX)
	hXmit  = Stage(tracerEzTrcStageEZ_TRC_H_XMIT)
	pRX    = Stage(tracerEzTrcStageEZ_TRC_P_RX)
	pDone  = Stage(tracerEzTrcStageEZ_TRC_P_DONE)
)

func TestSegmentsSplitTotal(t *testing.T) {
	r := rec(map[Stage]uint64{pQueue: 1000, hRX: 1300, hXmit: 2000, pRX: 2100, StageCopy: 5000, pDone: 1250})
	seg := r.Segments()
	want := []Segment{{hRX, 300}, {hXmit, 700}, {pRX, 100}, {StageCopy, 2900}}
	if len(seg) != len(want) {
		t.Fatalf("segments %v", seg)
	}
	for i := range want {
		if seg[i] != want[i] {
			t.Errorf("segment %d = %v, want %v (xmit_done must not count)", i, seg[i], want[i])
		}
	}
	if r.Total() != 4000 {
		t.Errorf("total %d", r.Total())
	}
	out, host, in := r.Split()
	if out != 0 || host != 1000 || in != 3000 {
		t.Errorf("split %d %d %d", out, host, in)
	}
	r.LastNS = 6000 // left a netfilter table after the last stage
	if r.Total() != 5000 {
		t.Errorf("total with netfilter exit %d", r.Total())
	}
}

func TestReportPercentilesAndPDV(t *testing.T) {
	p := NewReport()
	for i := 1; i <= 100; i++ {
		r := rec(map[Stage]uint64{pQueue: 1000, hRX: 1000 + uint64(i)*1000})
		p.Add(&r)
	}
	for _, row := range p.Rows() {
		if row.Name != "-> h_rx" {
			continue
		}
		// 1..100 µs: P1 = 1.99, P99 = 99.01, PDV = P99 - P1.
		if math.Abs(row.P1-1.99) > 1e-9 || math.Abs(row.P99-99.01) > 1e-9 || math.Abs(row.PDV-97.02) > 1e-9 || row.P50 != 50.5 {
			t.Errorf("h_rx %+v", row.Summary)
		}
		return
	}
	t.Fatal("no h_rx row")
}

func TestCSVOneRowPerPacket(t *testing.T) {
	var b bytes.Buffer
	w, err := NewCSVWriter(&b)
	if err != nil {
		t.Fatal(err)
	}
	r := rec(map[Stage]uint64{pQueue: 10, hRX: 25})
	r.Proto, r.SPort, r.DPort, r.Skb = 6, 1, 2, 0xabc
	r.NF[3] = 7
	for i := 0; i < 3; i++ {
		if err := w.Write(&r); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 || len(rows[0]) != len(rows[1]) {
		t.Fatalf("rows %d, columns %d/%d", len(rows), len(rows[0]), len(rows[1]))
	}
	col := map[string]string{}
	for i, h := range rows[0] {
		col[h] = rows[1][i]
	}
	checks := map[string]string{"proto": "tcp", "skb": "0xabc", "ts_p_queue": "10", "ts_h_rx": "25", "ts_p_rx": "",
		"total_ns": "15", "nf_p_pre_dnat_ns": "7", "sport": "1", "dport": "2"}
	for k, v := range checks {
		if col[k] != v {
			t.Errorf("%s = %q, want %q", k, col[k], v)
		}
	}
}

func TestHistogram(t *testing.T) {
	var h Histogram
	for _, v := range []uint64{0, 1, 1000, 1023, 1024, 1 << 60} {
		h.Add(v)
	}
	if h.N != 6 || h.Buckets[10] != 2 || h.Buckets[11] != 1 || h.Buckets[39] != 1 {
		t.Errorf("buckets %v", h.Buckets)
	}
	var b bytes.Buffer
	h.Render(&b, "x", 10)
	if !strings.Contains(b.String(), "##########") {
		t.Errorf("render:\n%s", b.String())
	}
}

func TestParseChains(t *testing.T) {
	js := `{"nftables":[{"metainfo":{}},{"table":{"family":"ip","name":"filter"}},
	{"chain":{"family":"ip","table":"filter","name":"INPUT","type":"filter","hook":"input","prio":0}},
	{"chain":{"family":"inet","table":"t","name":"pre","type":"nat","hook":"prerouting","prio":-100}},
	{"chain":{"family":"ip","table":"filter","name":"user"}},
	{"chain":{"family":"arp","table":"a","name":"x","type":"filter","hook":"input","prio":0}}]}`
	cs, err := parseChains([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.String())
	}
	got := strings.Join(names, ", ")
	want := "ipv4 pre conntrack, ipv4 pre dnat, ipv4 in filter, ipv4 out conntrack, ipv6 pre conntrack, ipv6 pre dnat, ipv6 out conntrack"
	if got != want {
		t.Errorf("chains\n got %s\nwant %s", got, want)
	}
}

func TestParseIface(t *testing.T) {
	if i, err := ParseIface("ns1:eth0"); err != nil || i.NetNS != "ns1" || i.Name != "eth0" {
		t.Errorf("%v %v", i, err)
	}
	if i, err := ParseIface("br0"); err != nil || i.NetNS != "" || i.Name != "br0" {
		t.Errorf("%v %v", i, err)
	}
	if _, err := ParseIface("ns:"); err == nil {
		t.Error("empty name accepted")
	}
}
