package scale

import (
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/lab/bench"
)

// TestCPUGoal: the goal is judged on the shortcut's cost over the gauge's,
// not on its undivided CPU (which the host's drift moves): a drift of
// +50% with a flat ratio passes, a ratio up 20% misses, and a step whose
// A/A interval is too wide judges nothing.
func TestCPUGoal(t *testing.T) {
	valid := bench.Paired{Pairs: 8, Median: 0.1, Lo: -1, Hi: 1}
	wide := bench.Paired{Pairs: 8, Median: 0.1, Lo: -4, Hi: 5}
	row := func(conns int, cpu, over float64, aa bench.Paired) Row {
		r := Row{Conns: conns, CPUAA: aa, GaugeCPUPerMsg: cpu / over}
		for i := range 8 {
			jit := 1 + 0.002*float64(i%3-1)
			r.CPUPerMsgRuns = append(r.CPUPerMsgRuns, cpu*jit)
			r.PlainCPUPerMsgRuns = append(r.PlainCPUPerMsgRuns, 1.5*cpu*jit)
			r.CPUOverGauge = append(r.CPUOverGauge, over*jit)
			r.PlainOverGauge = append(r.PlainOverGauge, 1.5*over*jit)
		}
		return r
	}
	for _, c := range []struct {
		name        string
		first, last Row
		want        string
	}{
		{"drift, flat ratio", row(1000, 4, 0.8, valid), row(1000000, 6, 0.8, valid), "within +10%: " + bench.Pass},
		{"ratio up 20%", row(1000, 4, 0.8, valid), row(1000000, 4, 0.96, valid), "within +10%: " + bench.Miss},
		{"first A/A wide", row(1000, 4, 0.8, wide), row(1000000, 4, 0.8, valid), "within +10%: " + bench.NotJudged + " (at 1000 connections"},
		{"last A/A wide", row(1000, 4, 0.8, valid), row(1000000, 4, 0.8, wide), "within +10%: " + bench.NotJudged + " (at 1000000 connections"},
	} {
		got := cpuGoal(c.first, c.last)
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q in it", c.name, got, c.want)
		}
	}
	// The programs' time over the gauge, judged the same way.
	first, last := row(1000, 4, 0.8, valid), row(1000000, 4, 0.8, valid)
	first.ProgNsRuns, first.ProgOverGauge = first.CPUPerMsgRuns, first.CPUOverGauge
	last.ProgNsRuns, last.ProgOverGauge = last.CPUPerMsgRuns, last.CPUOverGauge
	if got := progGoal(first, last); !strings.Contains(got, "within +10%: "+bench.Pass) {
		t.Errorf("programs, flat: %q", got)
	}
	for i := range last.ProgOverGauge {
		last.ProgOverGauge[i] *= 1.2
	}
	if got := progGoal(first, last); !strings.Contains(got, "within +10%: "+bench.Miss) {
		t.Errorf("programs, up 20%%: %q", got)
	}
	if got := cpuGoal(Row{Conns: 1000}, Row{Conns: 1000000}); !strings.Contains(got, bench.NotJudged) {
		t.Errorf("rows without gauge runs: %q, want %s", got, bench.NotJudged)
	}
}
