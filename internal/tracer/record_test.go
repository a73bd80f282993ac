package tracer

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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

func TestTableOf(t *testing.T) {
	for _, c := range []struct {
		prio int32
		want Table
	}{
		{-300, TableRaw}, {-290, TableRaw}, {-200, TableConntrack}, {-150, TableMangle}, {-110, TableDNAT},
		{-100, TableDNAT}, {0, TableFilter}, {10, TableFilter}, {100, TableSNAT}, {300, TableSNAT}, {-1000, TableRaw},
	} {
		if got := tableOf(c.prio); got != c.want {
			t.Errorf("tableOf(%d) = %s, want %s", c.prio, got, c.want)
		}
	}
}

func TestChainsOf(t *testing.T) {
	ip := &nftables.Table{Name: "filter", Family: nftables.TableFamilyIPv4}
	inet := &nftables.Table{Name: "t", Family: nftables.TableFamilyINet}
	arp := &nftables.Table{Name: "a", Family: nftables.TableFamilyARP}
	chains := []*nftables.Chain{
		{Name: "INPUT", Table: ip, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Type: nftables.ChainTypeFilter},
		{Name: "pre", Table: inet, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Type: nftables.ChainTypeNAT},
		{Name: "mangle-post", Table: ip, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityMangle, Type: nftables.ChainTypeFilter},
		{Name: "user", Table: ip},
		{Name: "x", Table: arp, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Type: nftables.ChainTypeFilter},
	}
	var names []string
	for _, c := range chainsOf(chains, nil) {
		names = append(names, fmt.Sprintf("%s@%d", c, c.Priority))
	}
	got := strings.Join(names, ", ")
	want := "ipv4 pre conntrack@-200, ipv4 pre dnat@-100, ipv4 in filter@0, ipv4 out conntrack@-200, ipv4 post mangle@-150, " +
		"ipv6 pre conntrack@-200, ipv6 pre dnat@-100, ipv6 out conntrack@-200"
	if got != want {
		t.Errorf("chains\n got %s\nwant %s", got, want)
	}
	// A ct expression in an ip6 rule adds conntrack for IPv6 only.
	cs := chainsOf(chains[:1], map[nftables.TableFamily]bool{nftables.TableFamilyIPv6: true})
	names = names[:0]
	for _, c := range cs {
		names = append(names, c.String())
	}
	if got, want := strings.Join(names, ", "), "ipv4 in filter, ipv6 pre conntrack, ipv6 out conntrack"; got != want {
		t.Errorf("chains with ct\n got %s\nwant %s", got, want)
	}
}

func TestUsesConntrack(t *testing.T) {
	for _, c := range []struct {
		es   []expr.Any
		want bool
	}{
		{nil, false},
		{[]expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO}, &expr.Verdict{Kind: expr.VerdictAccept}}, false},
		{[]expr.Any{&expr.Ct{Key: expr.CtKeySTATE}}, true},
		{[]expr.Any{&expr.Match{Name: "conntrack"}}, true},
		{[]expr.Any{&expr.Match{Name: "state"}}, true},
		{[]expr.Any{&expr.Match{Name: "tcp"}}, false},
	} {
		if got := usesConntrack(c.es); got != c.want {
			t.Errorf("usesConntrack(%v) = %v, want %v", c.es, got, c.want)
		}
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

// TestReportPaths: lifetimes are grouped by the stages they went through,
// and each path lists the stages it saved against the longest one.
func TestReportPaths(t *testing.T) {
	p := NewReport()
	for i := 0; i < 3; i++ { // the kernel path
		r := rec(map[Stage]uint64{pQueue: 1000, hRX: 2000, hXmit: 3000, pRX: 4000, StageCopy: 5000})
		p.Add(&r)
	}
	for i := 0; i < 5; i++ { // a fast path: straight from the host's rx into the reader
		r := rec(map[Stage]uint64{pQueue: 1000, hRX: 1500, StageCopy: 2000})
		p.Add(&r)
	}
	paths := p.Paths()
	if len(paths) != 2 {
		t.Fatalf("paths %+v", paths)
	}
	fast, kernel := paths[0], paths[1]
	if fast.Packets != 5 || len(fast.Stages) != 3 || fmt.Sprint(fast.Saved) != fmt.Sprint([]Stage{hXmit, pRX}) || fast.Total.P50 != 1 {
		t.Errorf("fast path %+v", fast)
	}
	if kernel.Packets != 3 || len(kernel.Saved) != 0 || kernel.Total.P50 != 4 {
		t.Errorf("kernel path %+v", kernel)
	}
	var b bytes.Buffer
	if err := p.Write(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "h_xmit p_rx") {
		t.Errorf("report does not list the saved stages:\n%s", b.String())
	}
	one := NewReport()
	r := rec(map[Stage]uint64{pQueue: 1000, hRX: 2000})
	one.Add(&r)
	b.Reset()
	one.Write(&b)
	if strings.Contains(b.String(), "paths") {
		t.Errorf("one path: no paths table expected:\n%s", b.String())
	}
}

// TestPartsCrossNode: a cross-node lifetime (sending pod, first node, the
// wire, second node, receiving pod) split by namespace; the parts add up to
// the total and Split folds both nodes and the wire into "host".
func TestPartsCrossNode(t *testing.T) {
	h2RX, h2Xmit := Stage(tracerEzTrcStageEZ_TRC_H2RX), Stage(tracerEzTrcStageEZ_TRC_H2XMIT)
	if h2RX != StageHost2RX || !h2RX.Host() || !h2RX.Host2() || hXmit.Host2() || pRX.Host() {
		t.Fatalf("sides: h2_rx host %v host2 %v, h_xmit host2 %v, p_rx host %v", h2RX.Host(), h2RX.Host2(), hXmit.Host2(), pRX.Host())
	}
	if h2RX.String() != "h2_rx" || Stage(tracerEzTrcStageEZ_TRC_H2DONE).String() != "h2_xmit_done" {
		t.Errorf("names %q %q", h2RX, Stage(tracerEzTrcStageEZ_TRC_H2DONE))
	}
	r := rec(map[Stage]uint64{pQueue: 1000, hRX: 1100, hXmit: 1500, h2RX: 1800, h2Xmit: 2400, pRX: 2450, StageCopy: 4450})
	p := r.Parts()
	want := Parts{PodOut: 0, Host: 500, Wire: 300, Host2: 600, PodIn: 2050}
	if p != want {
		t.Errorf("parts %+v, want %+v", p, want)
	}
	if sum := p.PodOut + p.Host + p.Wire + p.Host2 + p.PodIn; sum != r.Total() {
		t.Errorf("parts add up to %d, total %d", sum, r.Total())
	}
	if out, host, in := r.Split(); out != 0 || host != 1400 || in != 2050 {
		t.Errorf("split %d %d %d", out, host, in)
	}
	// Same node: no second host, no wire.
	r = rec(map[Stage]uint64{pQueue: 1000, hRX: 1300, hXmit: 2000, pRX: 2100, StageCopy: 5000})
	if p := r.Parts(); p != (Parts{Host: 1000, PodIn: 3000}) {
		t.Errorf("same-node parts %+v", p)
	}
}

func TestNFSlotNames(t *testing.T) {
	per := NFSlots / 3
	for i, want := range map[int]string{0: "p_pre_raw", per: "h_pre_raw", 2 * per: "h2_pre_raw", NFSlots - 1: "h2_post_snat"} {
		if got := NFSlotName(i); got != want {
			t.Errorf("slot %d = %q, want %q", i, got, want)
		}
	}
}
