package quick

import (
	"math"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
)

// round builds a Round from p50s (us) and FCTs (s); p99 is twice p50.
func round(unix, base24, acc24, baseFCT, accFCT float64, pairs uint64) Round {
	m := func(p50, fct float64) Measurement {
		s := stats.Summary{P50: p50, P99: 2 * p50}
		return Measurement{RTT24: s, RTT64K: s, FCT: fct}
	}
	return Round{
		Unix:        stats.Summary{P50: unix},
		Baseline:    m(base24, baseFCT),
		Accelerated: m(acc24, accFCT),
		Counters:    datapath.Counters{"pairs": pairs, "bytes_redirected": 100},
	}
}

func results(rounds ...Round) Results {
	o := DefaultOptions()
	o.Rounds = len(rounds)
	return Results{Options: o, Rounds: rounds}
}

func TestReportAllPass(t *testing.T) {
	// Medians: unix 14, baseline 30 -> accelerated 15 (-50%, 1.07x unix),
	// FCT 3 s -> 1.5 s (0.5x). The outlier round must not move the medians.
	rep := NewReport(results(
		round(14, 30, 15, 3, 1.5, 3),
		round(13, 29, 14, 2.9, 1.4, 3),
		round(90, 90, 90, 9, 9, 3),
	))
	want := []struct {
		value float64
		pass  bool
	}{{-50, true}, {15.0 / 14, true}, {0.5, true}}
	for i, w := range want {
		got := rep.Targets[i]
		if math.Abs(got.Value-w.value) > 1e-9 || got.Pass != w.pass {
			t.Errorf("target %q: value %v pass %v, want %v %v", got.Name, got.Value, got.Pass, w.value, w.pass)
		}
	}
	if !rep.Verified || rep.Counters["pairs"] != 9 || rep.Counters["bytes_redirected"] != 300 {
		t.Errorf("verified %v counters %v, want verified with 9 pairs and 300 bytes", rep.Verified, rep.Counters)
	}
	var b strings.Builder
	if err := rep.Write(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{
		"| RTT 24 B p50 (us)             |     30.0 |        15.0 | -50.0% |",
		"| 1 GiB FCT (s)                 |     3.00 |        1.50 | -50.0% |",
		"| unix socket RTT 24 B p50 (us) |     14.0 |           - |      - |",
		"| p50 RTT at least 45% lower (24 B)                        | -50.0% | <= -45.0% |   PASS |",
		"| accelerated 24 B p50 within 1.15x of unix socketpair p50 |  1.07x |  <= 1.15x |   PASS |",
		"| 1 GiB FCT at most 0.55x baseline                         |  0.50x |  <= 0.55x |   PASS |",
		"pairs=9 bytes_redirected=300",
		"acceleration verified: pairs per round 3, 3, 3",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
	if strings.Contains(out, "MISS") {
		t.Errorf("unexpected MISS:\n%s", out)
	}
}

func TestReportMisses(t *testing.T) {
	// -33% RTT, 1.43x the unix floor, FCT 0.67x: every target missed, and a
	// round without pairs means acceleration is not verified.
	rep := NewReport(results(round(14, 30, 20, 3, 2, 0)))
	for _, tg := range rep.Targets {
		if tg.Pass {
			t.Errorf("target %q passed with %v (limit %v)", tg.Name, tg.Value, tg.Limit)
		}
	}
	if rep.Verified {
		t.Error("verified without pairs")
	}
	var b strings.Builder
	rep.Write(&b)
	if got := strings.Count(b.String(), "MISS"); got != 3 {
		t.Errorf("%d MISS, want 3:\n%s", got, b.String())
	}
	if !strings.Contains(b.String(), "ACCELERATION NOT VERIFIED") {
		t.Errorf("no warning about missing pairs:\n%s", b.String())
	}
}

func TestReportNoData(t *testing.T) {
	// Zero baselines give no ratio: a target without a value is missed.
	rep := NewReport(results(round(0, 0, 0, 0, 0, 1)))
	for _, tg := range rep.Targets {
		if tg.Pass || !math.IsNaN(tg.Value) {
			t.Errorf("target %q: value %v pass %v, want NaN and MISS", tg.Name, tg.Value, tg.Pass)
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
