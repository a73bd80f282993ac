package quick

import (
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
)

// phases of one round, as factors of a drifting host: the baseline's 24 B
// p50 is 30 us and its FCT 3 s times drift; the accelerated phase scales
// both (rtt, fct); the second A/A phase is aa times the first; the unix
// floor is 14 us times drift. p99 is twice p50.
type phases struct {
	drift, rtt, fct, aa float64
	pairs               uint64
}

func (p phases) round(i int) Round {
	m := func(p50, fct float64) Measurement {
		s := stats.Summary{P50: p50, P99: 2 * p50}
		return Measurement{RTT24: s, RTT64K: s, FCT: fct, TCPMemPeak: 8 << 20}
	}
	d := p.drift
	return Round{
		Unix:             stats.Summary{P50: 14 * d},
		AA:               [2]Measurement{m(30*d, 3*d), m(30*d*p.aa, 3*d*p.aa)},
		Baseline:         m(30*d, 3*d),
		Accelerated:      m(30*d*p.rtt, 3*d*p.fct),
		AcceleratedFirst: i%2 == 1,
		Counters:         datapath.Counters{"pairs": p.pairs, "bytes_redirected": 100},
	}
}

func results(ps ...phases) Results {
	o := DefaultOptions()
	o.Rounds = len(ps)
	res := Results{Options: o}
	for i, p := range ps {
		res.Rounds = append(res.Rounds, p.round(i))
	}
	return res
}

func write(t *testing.T, rep Report) string {
	t.Helper()
	var b strings.Builder
	if err := rep.Write(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func verdicts(rep Report) []string {
	var v []string
	for _, t := range rep.Targets {
		v = append(v, t.Verdict)
	}
	return strings.Fields(strings.Join(v, " "))
}

// TestReportAllPass: the host drifts by ±30% between rounds, the paired
// differences do not: -50% RTT and FCT in every round, the A/A phases
// within ±0.5%, the accelerated RTT 15/14 of the unix floor (+7.1%).
func TestReportAllPass(t *testing.T) {
	var ps []phases
	for i, d := range []float64{0.8, 1.3, 1.0, 0.9, 1.2, 1.1} {
		aa := 1.005
		if i%2 == 1 {
			aa = 0.995
		}
		ps = append(ps, phases{drift: d, rtt: 0.5, fct: 0.5, aa: aa, pairs: 3})
	}
	rep := NewReport(results(ps...))
	for _, tg := range rep.Targets {
		if tg.Verdict != bench.Pass {
			t.Errorf("target %q: %s %s (%s), want PASS", tg.Name, tg.Verdict, tg.Value, tg.Reason)
		}
	}
	if rtt := rep.Rows[0]; rtt.Change.Median != -50 || rtt.Change.Lo != -50 || rtt.Change.Hi != -50 || !rtt.AA.Contains(0) {
		t.Errorf("RTT row: change %s, A/A %s; want exactly -50%% and an A/A around 0", rtt.Change, rtt.AA)
	}
	if !rep.Verified || rep.Counters["pairs"] != 18 || rep.Counters["bytes_redirected"] != 600 {
		t.Errorf("verified %v counters %v, want verified with 18 pairs and 600 bytes", rep.Verified, rep.Counters)
	}
	out := write(t, rep)
	for _, s := range []string{
		"6 round(s) of four phases",
		"| RTT 24 B p50 (us)             |     31.5 |        15.8 | -50.0% [-50.0, -50.0] | -0.0% [-0.5, +0.5] |",
		"| 256 MiB FCT (s)               |     3.15 |        1.58 | -50.0% [-50.0, -50.0] | ",
		"| unix socket RTT 24 B p50 (us) |     14.7 |           - |                     - |                  - |",
		"| accelerated 24 B p50 at most 15% above unix socketpair p50 (1.15x) |    +7.1% [+7.1, +7.1] |",
		"upper end <= +15% |   PASS |",
		"pairs=18 bytes_redirected=600",
		"acceleration verified: pairs per round 3, 3, 3, 3, 3, 3",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "MISS") || strings.Contains(out, "NOT JUDGED") {
		t.Errorf("unexpected verdict:\n%s", out)
	}
}

// TestReportJudgesTheIntervalsEnd: the median RTT change is -50% but two
// rounds of six saw only -30%: the interval reaches above -45%, a MISS.
// A -40% FCT misses too, and a round without pairs is not verified.
func TestReportJudgesTheIntervalsEnd(t *testing.T) {
	var ps []phases
	for i, rtt := range []float64{0.5, 0.7, 0.5, 0.5, 0.7, 0.5} {
		ps = append(ps, phases{drift: 1 + 0.05*float64(i), rtt: rtt, fct: 0.6, aa: 1, pairs: uint64(i % 5)})
	}
	rep := NewReport(results(ps...))
	if rtt := rep.Rows[0].Change; rtt.Median != -50 || rtt.Hi <= -45 {
		t.Fatalf("RTT change %s: want median -50, upper end above -45", rtt)
	}
	if got := strings.Join(verdicts(rep), " "); got != "MISS MISS MISS" {
		t.Errorf("verdicts %s, want MISS MISS MISS (unix: up to +50%% over the floor)", got)
	}
	if rep.Verified {
		t.Error("verified with a round without pairs")
	}
	if out := write(t, rep); !strings.Contains(out, "ACCELERATION NOT VERIFIED") {
		t.Errorf("no warning about missing pairs:\n%s", out)
	}
}

// TestReportAAJudgesNothing: the two baseline phases of every round differ
// by 3%: whatever the A/B pairs say, no target is judged, and the report
// says why.
func TestReportAAJudgesNothing(t *testing.T) {
	var ps []phases
	for _, d := range []float64{1, 1.1, 0.9, 1} {
		ps = append(ps, phases{drift: d, rtt: 0.5, fct: 0.5, aa: 1.03, pairs: 3})
	}
	rep := NewReport(results(ps...))
	for _, tg := range rep.Targets {
		if tg.Verdict != bench.NotJudged || !strings.Contains(tg.Reason, "does not hold 0") {
			t.Errorf("target %q: %s (%q), want NOT JUDGED for the A/A", tg.Name, tg.Verdict, tg.Reason)
		}
	}
	out := write(t, rep)
	if n := strings.Count(out, "NOT JUDGED \""); n != 3 || !strings.Contains(out, "this run judges nothing") {
		t.Errorf("%d reasons, want 3 saying the run judges nothing:\n%s", n, out)
	}
	if !rep.Verified {
		t.Error("an A/A failure is not an acceleration failure")
	}
}

func TestReportNoData(t *testing.T) {
	// Zero baselines give no paired difference: nothing is judged.
	rep := NewReport(results(phases{pairs: 1}, phases{pairs: 1}))
	for _, tg := range rep.Targets {
		if tg.Verdict != bench.NotJudged || tg.Value.Cell() != "-" {
			t.Errorf("target %q: %s %s, want NOT JUDGED without a value", tg.Name, tg.Verdict, tg.Value.Cell())
		}
	}
	if NewReport(results()).Verified {
		t.Error("no rounds cannot verify acceleration")
	}
}

func TestSizeLabel(t *testing.T) {
	for n, want := range map[uint64]string{1 << 30: "1 GiB", 3 << 20: "3 MiB", 64 << 10: "64 KiB", 1000: "1000 B", 1<<30 + 1: "1073741825 B"} {
		if got := sizeLabel(n); got != want {
			t.Errorf("sizeLabel(%d) = %q, want %q", n, got, want)
		}
	}
}
