package services

import (
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func open(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// ITGDec's real summary (D-ITG 2.8.1): the TOTAL RESULTS block is read.
func TestParseDecSummary(t *testing.T) {
	tot, err := parseDecSummary(open(t, "itgdec-udp-summary.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want := Totals{Time: 1.999509, Packets: 1852, MinDelay: 0.000005, MaxDelay: 0.000522, AvgDelay: 0.000010, Jitter: 0.000007,
		SDDelay: 0.000018, Bytes: 948224, Kbps: 3793.827385, PktRate: 926.227389, Dropped: 0, ErrLines: 0, FlowCount: 1}
	if tot != want {
		t.Fatalf("got %+v\nwant %+v", tot, want)
	}
	tot, err = parseDecSummary(open(t, "itgdec-tcp-summary.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if tot.Packets != 27050 || tot.Kbps != 110792.091336 || tot.Bytes != 27699200 || tot.MaxDelay != 0.008185 {
		t.Fatalf("tcp: %+v", tot)
	}
}

// The bench's own flows through the lab (captured from a run): one
// flow's block and the totals; the totals win.
func TestParseDecSummaryLab(t *testing.T) {
	matches, _ := filepath.Glob("testdata/itgdec-lab-*.txt")
	if len(matches) == 0 {
		t.Fatal("no captured lab output in testdata")
	}
	for _, m := range matches {
		f, err := os.Open(m)
		if err != nil {
			t.Fatal(err)
		}
		tot, err := parseDecSummary(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if tot.Packets <= 0 || tot.Time <= 0 || tot.Bytes <= 0 || tot.FlowCount != 1 {
			t.Fatalf("%s: %+v", m, tot)
		}
	}
}

// Robust to the spinner (stderr) mixed into the output, to a missing
// TOTAL block (the last flow's block is used) and to junk.
func TestParseDecSummaryRobust(t *testing.T) {
	b, err := os.ReadFile("testdata/itgdec-udp-summary.txt")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	mixed := strings.Replace(s, "Total packets", `|\-/|\-/|\-/Total packets`, -1)
	tot, err := parseDecSummary(strings.NewReader(mixed))
	if err != nil || tot.Packets != 1852 {
		t.Fatalf("spinner mixed in: %+v %v", tot, err)
	}
	noTotal := s[:strings.Index(s, "__________")]
	tot, err = parseDecSummary(strings.NewReader(noTotal))
	if err != nil || tot.Packets != 1852 || tot.FlowCount != 1 {
		t.Fatalf("flow block only: %+v %v", tot, err)
	}
	if _, err := parseDecSummary(strings.NewReader("ITGDec version 2.8.1 (r1023)\nError: cannot open log\n")); err == nil {
		t.Fatal("no summary: no error")
	}
}

func TestParseDecPackets(t *testing.T) {
	d, err := parseDecPackets(open(t, "itgdec-udp-packets.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(d) != 40 {
		t.Fatalf("%d packets, want 40", len(d))
	}
	// Flow>0001 Seq> 1 ... txTime>17:13:26.070937 rxTime>17:13:26.070998
	if d[0] != 61 || d[1] != 33 {
		t.Fatalf("delays %v", d[:2])
	}
	for i, x := range d {
		if x < 0 {
			t.Fatalf("packet %d: negative delay %v", i, x)
		}
	}
	// Across midnight.
	d, err = parseDecPackets(strings.NewReader("Flow>0001 Seq> 9 Src> 10.0.0.1/1 Dest> 10.0.0.2/2 txTime>23:59:59.999990 rxTime>00:00:00.000015 Size> 512\n"))
	if err != nil || len(d) != 1 || d[0] != 25 {
		t.Fatalf("midnight: %v %v", d, err)
	}
	if _, err := parseDecPackets(strings.NewReader("Flow>0001 Seq> 9 Size> 512\n")); err == nil {
		t.Fatal("no times: no error")
	}
}

func TestParseDecBitrate(t *testing.T) {
	b, err := parseDecBitrate(open(t, "itgdec-tcp-bitrate.txt"))
	if err != nil {
		t.Fatal(err)
	}
	// 11 rows, the short last one dropped; Kbit/s to Mbit/s.
	if len(b) != 10 || math.Abs(b[0]-148.0704) > 1e-9 || math.Abs(b[9]-97.4848) > 1e-9 {
		t.Fatalf("%v", b)
	}
	if _, err := parseDecBitrate(strings.NewReader("0.0 1.0\n")); err == nil {
		t.Fatal("no header: no error")
	}
}

// The table math: SD and max ratios of eztunnel over iptables and
// nftables, the absolute values beside them, loss from the flows' totals.
func TestDITGTable(t *testing.T) {
	res := Result{DITG: DITG{N: 1, Duration: time.Second}, Steps: []Step{
		{Count: 1, Datapath: IPTables, UDPDelay: map[string][]float64{"nodeport-v4": {10, 20, 30, 40}},
			Flows: []Flow{{Path: "nodeport-v4", Proto: "UDP", Dec: Totals{Packets: 99, Dropped: 1}}}, DITGFails: map[string]int{"nodeport-v4/UDP": 1}},
		{Count: 1, Datapath: NFTables, UDPDelay: map[string][]float64{"nodeport-v4": {10, 10, 10, 50}}},
		{Count: 1, Datapath: Eztunnel, UDPDelay: map[string][]float64{"nodeport-v4": {15, 20, 25, 20}}},
	}}
	h, rows := ditgTable(res, []string{IPTables, NFTables, Eztunnel}, MetricUDPDelay, "nodeport-v4")
	if len(rows) != 1 || len(rows[0]) != len(h) {
		t.Fatalf("header %v rows %v", h, rows)
	}
	col := func(name string) string {
		for i, x := range h {
			if x == name {
				return rows[0][i]
			}
		}
		t.Fatalf("no column %q in %v", name, h)
		return ""
	}
	// Population SDs: ipt sqrt(125) = 11.18, nft sqrt(300) = 17.32, ez sqrt(12.5) = 3.54.
	for name, want := range map[string]string{
		"SD ez/ipt": "0.32", "max ez/ipt": "0.62", "SD ez/nft": "0.20", "max ez/nft": "0.50",
		"iptables mean": "25.0", "iptables p50": "25.0", "iptables SD": "11.2", "iptables max": "40.0",
		"iptables loss %": "1.00", "iptables retried": "1", "eztunnel retried": "0", "nftables loss %": "–",
	} {
		if got := col(name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	// No throughput samples: dashes, not zeros.
	_, rows = ditgTable(res, []string{IPTables, NFTables, Eztunnel}, MetricThroughput, "nodeport-v4")
	if rows[0][1] != "–" || rows[0][2] != "–" {
		t.Fatalf("empty throughput row %v", rows[0])
	}
}

// The D-ITG Service: port = targetPort = nodePort (D-ITG tells the
// receiver the port to open), TCP and UDP, eTP Local, outside the bench's
// NodePorts.
func TestDITGService(t *testing.T) {
	s := ditgService()
	if s.Spec.Type != "NodePort" || s.Spec.ExternalTrafficPolicy != "Local" || len(s.Spec.Ports) != 2 {
		t.Fatalf("%+v", s.Spec)
	}
	for _, p := range s.Spec.Ports {
		if p.Port != ditgPort || p.NodePort != ditgPort || p.TargetPort.IntValue() != ditgPort {
			t.Fatalf("port %+v", p)
		}
	}
	if nodePort(MaxNodePorts-1) >= ditgPort {
		t.Fatalf("D-ITG NodePort %d collides with the bench's", ditgPort)
	}
}

// Merge: disjoint counts from several runs in one report; a count in two
// runs, or different D-ITG settings, is refused.
func TestMerge(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, r Result) string {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name+".json")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	d := DITG{N: 1, Duration: time.Second}
	st := func(c int, dp string) Step {
		return Step{Count: c, Datapath: dp, UDPDelay: map[string][]float64{"clusterip-v4": {float64(c)}}}
	}
	a := write("a", Result{DITG: d, Steps: []Step{st(1, IPTables), st(1, Eztunnel)}, CreateTimes: map[int]float64{1: 0.1}})
	b := write("b", Result{DITG: d, Steps: []Step{st(10000, Eztunnel), st(10000, IPTables)}, CreateTimes: map[int]float64{10000: 99}})
	var out strings.Builder
	if err := Merge([]string{a, b}, "", &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "| 10000 ") || !strings.Contains(out.String(), "| 1 ") {
		t.Fatalf("merged report lacks a count:\n%s", out.String())
	}
	if strings.Contains(out.String(), "nftables mean") {
		t.Fatal("nftables columns with no nftables step")
	}
	if err := Merge([]string{a, a}, "", io.Discard); err == nil {
		t.Fatal("the same count twice: no error")
	}
	c := write("c", Result{DITG: DITG{N: 2}, Steps: []Step{st(5000, Eztunnel)}})
	if err := Merge([]string{a, c}, "", io.Discard); err == nil {
		t.Fatal("different D-ITG settings: no error")
	}
}

// The first packet of each flow, found from the flows' packet counts.
func TestFirstPackets(t *testing.T) {
	s := &Step{UDPDelay: map[string][]float64{"nodeport-v4": {100, 1, 2, 200, 3}}, Flows: []Flow{
		{Path: "nodeport-v4", Proto: "TCP", Dec: Totals{Packets: 50}},
		{Path: "nodeport-v4", Proto: "UDP", Dec: Totals{Packets: 3}},
		{Path: "clusterip-v4", Proto: "UDP", Dec: Totals{Packets: 7}},
		{Path: "nodeport-v4", Proto: "UDP", Dec: Totals{Packets: 2}},
	}}
	if got := firstPackets(s, "nodeport-v4"); len(got) != 2 || got[0] != 100 || got[1] != 200 {
		t.Fatalf("%v", got)
	}
	s.Flows[3].Dec.Packets = 3 // does not add up: no answer rather than a wrong one
	if got := firstPackets(s, "nodeport-v4"); got != nil {
		t.Fatalf("%v", got)
	}
}
