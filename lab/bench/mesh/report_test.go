package mesh

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/meshlab"
)

// The fixture (testdata/lab) holds two rounds of mesh "none" (the A/A
// runs copies of the A/B pair's baseline, so every A/A is exactly 0):
// back-to-back ping-echo samples baseline {10,20,30,40} and {20,30,40,50}
// (pooled p50 30), eztunnel {5,10,15,20} and {10,15,20,25} (pooled p50 15);
// RPS 40000/30000 vs 80000/60000; FCT 1.0/1.2 s vs 0.5/0.6 s; CPU 1.0 s vs
// 1.2 s per 100 ping-echo messages; memory used 1000/1002 MB vs 1010/1012 MB.
func TestLabReportFromFixture(t *testing.T) {
	runs, facts, err := Load("testdata/lab")
	if err != nil {
		t.Fatal(err)
	}
	rep := NewReport(runs, facts, nil)
	if len(rep.Meshes) != 1 || rep.Meshes[0] != "none" || !rep.Verified {
		t.Fatalf("meshes %v verified %v", rep.Meshes, rep.Verified)
	}
	want := map[string]struct {
		value   float64
		verdict string
	}{
		"ping-echo-b2b p50":                     {-50, bench.Pass}, // 30 -> 15 us
		"ping-echo-b2b RPS":                     {100, bench.Pass}, // 40000 -> 80000, 30000 -> 60000
		"file-transfer FCT":                     {-50, bench.Pass}, // 1.0 -> 0.5 s and 1.2 -> 0.6 s
		"ping-echo-b2b CPU s/op":                {20, bench.Miss},  // 0.010 -> 0.012
		"file-transfer CPU s/op":                {-50, bench.Pass}, // 0.011 -> 0.0055
		"datapath memory (BPF maps + programs)": {2.9, bench.Pass}, // 2.8 + 0.1
	}
	for _, tg := range rep.Targets {
		w, ok := want[tg.Name]
		if !ok {
			t.Errorf("unexpected target %q", tg.Name)
			continue
		}
		delete(want, tg.Name)
		if math.Abs(tg.Value.Median-w.value) > 1e-9 || tg.Verdict != w.verdict {
			t.Errorf("%s: %v %s (%s), want %v %s", tg.Name, tg.Value, tg.Verdict, tg.Reason, w.value, w.verdict)
		}
		if tg.Unit == "%" && (tg.Value.Lo != w.value || tg.Value.Hi != w.value || tg.AA.Median != 0 || tg.AA.Width() != 0) {
			t.Errorf("%s: change %s, A/A %s; want both pairs alike and an A/A of exactly 0", tg.Name, tg.Value, tg.AA)
		}
	}
	for name := range want {
		t.Errorf("target %q missing", name)
	}

	var b bytes.Buffer
	if err := rep.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	s := strings.Join(strings.Fields(b.String()), " ") // table padding collapsed
	for _, frag := range []string{
		"Machine: 2 CPUs (Test CPU), 2048 MB, kernel 6.18.0-test",
		"### Latency of ping-echo, back to back (us)",
		// pooled quartiles: baseline 20, 30, 30, 40; eztunnel 10, 15, 15, 20
		"| 20.0 | 30.0 | 30.0 | 40.0 |",
		"| 10.0 (-50.0%) | 15.0 (-50.0%) | 15.0 (-50.0%) | 20.0 (-50.0%) |",
		// FCT over repetitions: baseline 1.05, 1.1, 1.1, 1.15
		"| 1.050 | 1.100 | 1.100 | 1.150 |",
		"| 0.525 (-50.0%) | 0.550 (-50.0%) | 0.550 (-50.0%) | 0.575 (-50.0%) |",
		// socket memory of file-transfer: 4, 6 MB vs 1, 2 MB
		"| TCP socket memory, peak rise in file-transfer (sockstat) | 5.0 | 1.5 | 4.0..6.0 / 1.0..2.0 |",
		"| context: machine MemTotal-MemAvailable | 1001.0 | 1011.0 |",
		"| datapath BPF programs | - | 0.05 | - |", // median of 0, 0, 0.1, 0.1
		"| none | ping-echo-b2b | 3, 3 | 1, 1 |",
	} {
		if !strings.Contains(s, frag) {
			t.Errorf("summary lacks %q:\n%s", frag, s)
		}
	}
}

// TestRenderLabReport renders summary, CSV and plots from a copy of the
// fixture, as `bench lab --report DIR` does.
func TestRenderLabReport(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "raw"), 0o755)
	files, _ := filepath.Glob("testdata/lab/*.json")
	raw, _ := filepath.Glob("testdata/lab/raw/*.json")
	for _, f := range append(files, raw...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel("testdata/lab", f)
		if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := RenderReport(dir)
	if err != nil {
		t.Fatal(err)
	}
	csv, _ := os.ReadFile(filepath.Join(dir, "runs.csv"))
	if n := strings.Count(string(csv), "\n"); n != 17 {
		t.Errorf("runs.csv has %d lines, want header + 16", n)
	}
	for _, f := range []string{"summary.md", "plots/cdf-ping-echo-b2b.svg", "plots/cdf-ping-echo-b2b.png",
		"plots/box-file-transfer-fct.svg", "plots/box-ping-echo-b2b-latency.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	var b bytes.Buffer
	rep.WriteMain(&b)
	if !strings.Contains(b.String(), "ping-echo b2b p50 (us)") || !strings.Contains(b.String(), "-50.0% [-50.0, -50.0] | +0.0% [+0.0, +0.0] |") {
		t.Errorf("main table:\n%s", b.String())
	}
}

// Paired changes take each round's baseline and eztunnel runs together;
// the change shown is their median with its bootstrap interval, the A/A
// "-" without A/A runs.
func TestPairedChanges(t *testing.T) {
	var runs []Run
	for rep, v := range [][2]float64{{100, 50}, {200, 90}, {100, 60}, {100, 40}} {
		runs = append(runs, Run{Mesh: "none", Mode: ModeBaseline, Rep: rep + 1, Workload: WRedis, Rate: v[0], Latency: stats.Summary{P50: v[0]}},
			Run{Mesh: "none", Mode: ModeEztunnel, Rep: rep + 1, Workload: WRedis, Rate: v[1], Latency: stats.Summary{P50: v[1]}})
	}
	runs = append(runs, Run{Mesh: "none", Mode: ModeEztunnel, Rep: 5, Workload: WRedis, Rate: 1, Latency: stats.Summary{P50: 1}}) // no partner
	rep := NewReport(runs, Facts{Options: Options{Quick: true, Reps: 4}}, nil)
	c := rep.change("none", WRedis, func(r Run) float64 { return r.Rate })
	// per-round changes -50, -55, -40, -60: median -52.5
	if c.Pairs != 4 || c.Median != -52.5 || c.Lo < -60 || c.Hi > -40 || c.Lo > c.Median || c.Hi < c.Median {
		t.Errorf("change %+v", c)
	}
	var b bytes.Buffer
	if err := rep.WriteMain(&b); err != nil {
		t.Fatal(err)
	}
	s := strings.Join(strings.Fields(b.String()), " ")
	for _, frag := range []string{
		"| redis p50 (us) | 100.0 | 50.0 | " + c.String() + " | - |", // trimmed means of 100, 100, 100, 200 and of 1, 40, 50, 60, 90
		"| none | ping-echo-paced p50 | - | - | upper end <= -45% | not judged by --quick |",
		"| none | CPU s/op | - | - | upper end <= +0% | not judged by --quick |",
		"| none | redis OPS | - | - | lower end >= +40% | not judged by --quick |",
	} {
		if !strings.Contains(s, frag) {
			t.Errorf("main output lacks %q:\n%s", frag, b.String())
		}
	}
	if strings.Contains(s, "| redis OPS | 100") {
		t.Errorf("a quick run shows redis OPS:\n%s", b.String())
	}
}

// abRuns is six rounds of back-to-back ping-echo on a drifting machine:
// the A/B pair's eztunnel run ez times its baseline's p50 (per round),
// the second A/A run aa[i] times the first.
func abRuns(ez, aa []float64) []Run {
	var runs []Run
	for i, f := range ez {
		d := 100 * (1 + 0.1*float64(i%3))
		run := func(mode string, p50 float64) Run {
			return Run{Mesh: "none", Mode: mode, Rep: i + 1, Workload: WB2B, Latency: stats.Summary{P50: p50},
				Counters: map[string]uint64{"pairs": 20}}
		}
		runs = append(runs, run(ModeAA1, d), run(ModeAA2, d*aa[i]), run(ModeBaseline, d), run(ModeEztunnel, d*f))
	}
	return runs
}

// TestTargetsOnIntervals: b2b p50 must fall by 45% in mesh none: judged on
// the interval's upper end, and only when the A/A holds 0 within ±2%.
func TestTargetsOnIntervals(t *testing.T) {
	b2b := func(runs []Run) Target {
		for _, tg := range NewReport(runs, Facts{Options: Options{Quick: true, Meshes: []string{"none"}}}, nil).Targets {
			if tg.Name == WB2B+" p50" {
				return tg
			}
		}
		t.Fatal("no b2b p50 target")
		return Target{}
	}
	half := []float64{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}
	quiet := []float64{1.005, 0.995, 1, 1.005, 0.995, 1}
	if tg := b2b(abRuns(half, quiet)); tg.Verdict != bench.Pass {
		t.Errorf("-50%% every round: %s %s (%s), want PASS", tg.Verdict, tg.Value, tg.Reason)
	}
	// Median -50%, but two rounds of six at -30%: the upper end is above -45%.
	if tg := b2b(abRuns([]float64{0.5, 0.7, 0.5, 0.5, 0.7, 0.5}, quiet)); tg.Verdict != bench.Miss || tg.Value.Median != -50 {
		t.Errorf("-50%% median, -30%% upper end: %s %s, want MISS", tg.Verdict, tg.Value)
	}
	offset := []float64{1.03, 1.03, 1.03, 1.03, 1.03, 1.03}
	tg := b2b(abRuns(half, offset))
	if tg.Verdict != bench.NotJudged || !strings.Contains(tg.Reason, "does not hold 0") {
		t.Errorf("A/A +3%%: %s (%q), want NOT JUDGED", tg.Verdict, tg.Reason)
	}
	wide := []float64{1.04, 0.96, 1, 1.04, 0.96, 1}
	if tg := b2b(abRuns(half, wide)); tg.Verdict != bench.NotJudged || !strings.Contains(tg.Reason, "wider than") {
		t.Errorf("A/A ±4%%: %s (%q), want NOT JUDGED", tg.Verdict, tg.Reason)
	}
	rep := NewReport(abRuns(half, offset), Facts{Options: Options{Quick: true}}, nil)
	var b bytes.Buffer
	rep.WriteMain(&b)
	if !strings.Contains(b.String(), `NOT JUDGED none "ping-echo-b2b p50": the A/A interval +3.0% [+3.0, +3.0] does not hold 0`) || !rep.Verified {
		t.Errorf("verified %v, output:\n%s", rep.Verified, b.String())
	}
}

// pairedFixture is a paired ping-echo of mesh none: 8 quads, B half of A,
// the A/A pair's phases within 0.5% of each other; the counters as the
// datapath reports them, contradicting a side when spoiled.
func pairedFixture(spoiled bool) PairedB2B {
	p := PairedB2B{Mesh: "none", Quads: 8, Phase: 100 * time.Millisecond, Conns: 4, Size: 24, Excl: meshlab.KernelPathPorts,
		Counters: [4]map[string]uint64{{"fallback_excluded": 32}, {"fallback_excluded": 32}, {"fallback_excluded": 32}, {"pairs": 32, "messages_redirected": 9000}}}
	for i := range p.Quads {
		a := 20 + float64(i%3)
		p.Medians[bench.SideA] = append(p.Medians[bench.SideA], a)
		p.Medians[bench.SideB] = append(p.Medians[bench.SideB], a/2)
		p.Medians[bench.SideAA1] = append(p.Medians[bench.SideAA1], a)
		p.Medians[bench.SideAA2] = append(p.Medians[bench.SideAA2], a*(1+0.005*float64(i%3-1)))
	}
	if spoiled {
		p.Accelerated = 1
	}
	return p
}

// TestPairedReport: a mesh's paired ping-echo gives its b2b p50 row (A and
// B phase medians, the change and the A/A with intervals) and its target,
// labels the other rows as rounds, and says what the counters prove; a
// phase whose counters contradict its side makes the report unverified.
func TestPairedReport(t *testing.T) {
	runs := abRuns([]float64{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, []float64{1, 1, 1, 1, 1, 1})
	for i := range runs {
		runs[i].Workload = WRedis
	}
	facts := Facts{Options: Options{Quick: true, Reps: 6, PairQuads: 8, Meshes: []string{"none"}}}
	rep := NewReport(runs, facts, map[string]PairedB2B{"none": pairedFixture(false)})
	var b bytes.Buffer
	if err := rep.WriteMain(&b); err != nil {
		t.Fatal(err)
	}
	p := rep.Paired["none"]
	s := strings.Join(strings.Fields(b.String()), " ")
	for _, frag := range []string{
		"| none | ping-echo b2b p50 (us), paired phases | 21.0 | 10.5 | -50.0% [-50.0, -50.0] | " + p.AA().String() + " |",
		"| redis p50 (us), 6 rounds |",
		"| none | ping-echo-b2b p50 (paired phases) | -50.0% [-50.0, -50.0] | " + p.AA().String() + " | upper end <= -45% | PASS |",
		"none: 0 s; B phases: 32 connections paired, 9000 messages redirected",
		"A and A/A phases: 0 paired, 0 redirected, 96 excluded",
		": B accelerated, A not",
	} {
		if !strings.Contains(s, frag) {
			t.Errorf("main output lacks %q:\n%s", frag, b.String())
		}
	}
	if !rep.Verified {
		t.Error("not verified")
	}
	rep = NewReport(runs, facts, map[string]PairedB2B{"none": pairedFixture(true)})
	b.Reset()
	rep.WriteMain(&b)
	if rep.Verified || !strings.Contains(b.String(), "ACCELERATION NOT VERIFIED: 0 B phase(s) not accelerated, 1 A phase(s) accelerated") {
		t.Errorf("an accelerated A phase: verified %v:\n%s", rep.Verified, b.String())
	}
}
