package mesh

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/eztunnel/eztunnel/internal/stats"
)

// Report is computed from a results directory's raw runs alone, so it
// can be rendered again later (`eztunnel bench lab --report DIR`).
type Report struct {
	Facts    Facts
	Runs     []Run
	Meshes   []string
	Targets  []Target
	Verified bool // every eztunnel run paired at least one connection
}

// Target is one goal of the issue, evaluated for one mesh mode: Value is
// the median of the paired changes, Min..Max their range.
type Target struct {
	Mesh     string
	Name     string
	Value    float64
	Min, Max float64
	Unit     string // "%" or "MB"
	Goal     string
	Pass     bool
	Verdict  string // PASS, MISS or "not judged by --quick"
}

// Load reads machine.json and every raw/*.json of a results directory.
func Load(dir string) ([]Run, Facts, error) {
	var facts Facts
	if b, err := os.ReadFile(filepath.Join(dir, "machine.json")); err == nil {
		if err := json.Unmarshal(b, &facts); err != nil {
			return nil, facts, fmt.Errorf("machine.json: %w", err)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "raw", "*.json"))
	if err != nil {
		return nil, facts, err
	}
	if len(files) == 0 {
		return nil, facts, fmt.Errorf("no raw results in %s", filepath.Join(dir, "raw"))
	}
	sort.Strings(files)
	var runs []Run
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, facts, err
		}
		var r Run
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, facts, fmt.Errorf("%s: %w", f, err)
		}
		runs = append(runs, r)
	}
	return runs, facts, nil
}

// RenderReport loads a results directory and writes summary.md,
// runs.csv and the plots into it.
func RenderReport(dir string) (*Report, error) {
	runs, facts, err := Load(dir)
	if err != nil {
		return nil, err
	}
	rep := NewReport(runs, facts)
	if err := writeFile(filepath.Join(dir, "summary.md"), rep.WriteSummary); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, "runs.csv"), rep.WriteCSV); err != nil {
		return nil, err
	}
	if err := rep.Plot(filepath.Join(dir, "plots")); err != nil {
		return nil, fmt.Errorf("plots: %w", err)
	}
	return rep, nil
}

// NewReport orders the meshes and evaluates the targets.
func NewReport(runs []Run, facts Facts) *Report {
	r := &Report{Facts: facts, Runs: runs, Verified: true}
	seen := map[string]bool{}
	for _, m := range facts.Options.Meshes {
		if !seen[m] && r.has(m) {
			seen[m] = true
			r.Meshes = append(r.Meshes, m)
		}
	}
	for _, run := range runs {
		if !seen[run.Mesh] {
			seen[run.Mesh] = true
			r.Meshes = append(r.Meshes, run.Mesh)
		}
		if run.Mode == ModeEztunnel && run.Counters["pairs"] == 0 {
			r.Verified = false
		}
	}
	for _, m := range r.Meshes {
		r.Targets = append(r.Targets, r.targets(m)...)
	}
	return r
}

func (r *Report) has(mesh string) bool {
	for _, run := range r.Runs {
		if run.Mesh == mesh {
			return true
		}
	}
	return false
}

// runs selects the runs of one mesh, mode and workload, in repetition order.
func (r *Report) runs(mesh, mode, workload string) []Run {
	var out []Run
	for _, run := range r.Runs {
		if run.Mesh == mesh && run.Mode == mode && run.Workload == workload {
			out = append(out, run)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rep < out[j].Rep })
	return out
}

// perRun summarizes one value of every run (quartiles over repetitions).
func (r *Report) perRun(mesh, mode, workload string, f func(Run) float64) stats.Summary {
	var xs []float64
	for _, run := range r.runs(mesh, mode, workload) {
		xs = append(xs, f(run))
	}
	return stats.Summarize(xs)
}

// pooled summarizes every latency sample of every repetition together.
func (r *Report) pooled(mesh, mode, workload string) stats.Summary {
	var xs []float64
	for _, run := range r.runs(mesh, mode, workload) {
		xs = append(xs, run.Samples...)
	}
	return stats.Summarize(xs)
}

// median of one per-run value; NaN when there are no runs.
func (r *Report) median(mesh, mode, workload string, f func(Run) float64) float64 {
	s := r.perRun(mesh, mode, workload, f)
	if s.N == 0 {
		return math.NaN()
	}
	return s.P50
}

// pairMedians returns the baseline and eztunnel medians of a value.
func (r *Report) pairMedians(mesh, workload string, f func(Run) float64) (float64, float64) {
	return r.median(mesh, ModeBaseline, workload, f), r.median(mesh, ModeEztunnel, workload, f)
}

// paired returns the change (%) of a per-run value from baseline to
// eztunnel in every repetition that has both: the two runs of a repetition
// are adjacent in time (ABBA order), so each pair saw the same machine.
func (r *Report) paired(mesh, workload string, f func(Run) float64) []float64 {
	base := map[int]float64{}
	for _, run := range r.runs(mesh, ModeBaseline, workload) {
		base[run.Rep] = f(run)
	}
	var out []float64
	for _, run := range r.runs(mesh, ModeEztunnel, workload) {
		if b, ok := base[run.Rep]; ok {
			out = append(out, stats.Change(b, f(run)))
		}
	}
	return out
}

// Spread is the median and range of paired changes (%).
type Spread struct {
	Median, Min, Max float64
	N                int
}

func spread(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{math.NaN(), math.NaN(), math.NaN(), 0}
	}
	s := stats.Summarize(xs)
	return Spread{s.P50, slices.Min(xs), slices.Max(xs), len(xs)}
}

// estimate of a value over a mode's repetitions: with f nil the p50 of
// every latency sample pooled, else the trimmed mean of the per-run values
// (the lowest and highest dropped from four runs on). NaN without runs.
func (r *Report) estimate(mesh, mode, workload string, f func(Run) float64) float64 {
	if f == nil {
		s := r.pooled(mesh, mode, workload)
		if s.N == 0 {
			return math.NaN()
		}
		return s.P50
	}
	var xs []float64
	for _, run := range r.runs(mesh, mode, workload) {
		xs = append(xs, f(run))
	}
	return trimmedMean(xs)
}

func trimmedMean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs) >= 4 {
		xs = xs[1 : len(xs)-1]
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// change of a value from baseline to eztunnel: the median and range of
// the per-repetition paired changes (with f nil, of the runs' latency
// p50). Pairing the adjacent runs of a repetition cancels slow drift of
// the machine; the median drops the outliers.
func (r *Report) change(mesh, workload string, f func(Run) float64) Spread {
	if f == nil {
		f = func(x Run) float64 { return x.Latency.P50 }
	}
	return spread(r.paired(mesh, workload, f))
}

// memory is the median and range over runs of a memory item, in MB.
func (r *Report) memory(mesh, mode, workload string, f func(Run) float64) Spread {
	var xs []float64
	for _, run := range r.Runs {
		if run.Mesh == mesh && run.Mode == mode && (workload == "" || run.Workload == workload) {
			xs = append(xs, f(run))
		}
	}
	return spread(xs)
}

// bpfMemory is the datapath's own memory in a mesh's eztunnel runs: BPF
// maps plus programs, the largest seen, in MB.
func (r *Report) bpfMemory(mesh string) float64 {
	m := math.NaN()
	for _, run := range r.Runs {
		if v := run.BPFMaps + run.BPFProgs; run.Mesh == mesh && run.Mode == ModeEztunnel && (math.IsNaN(m) || v > m) {
			m = v
		}
	}
	return m
}

// notJudged marks a target a quick run does not measure well enough.
const notJudged = "not judged by --quick"

func (r *Report) targets(mesh string) []Target {
	var ts []Target
	quick := r.Facts.Options.Quick
	add := func(name string, sp Spread, unit, goal string, pass func(float64) bool, judged bool) {
		t := Target{Mesh: mesh, Name: name, Value: sp.Median, Min: sp.Min, Max: sp.Max, Unit: unit, Goal: goal}
		switch {
		case !judged:
			t.Verdict = notJudged
		case sp.N == 0:
			return
		case pass(sp.Median):
			t.Verdict, t.Pass = "PASS", true
		default:
			t.Verdict = "MISS"
		}
		ts = append(ts, t)
	}
	atMost := func(limit float64) func(float64) bool { return func(x float64) bool { return x <= limit } }
	atLeast := func(limit float64) func(float64) bool { return func(x float64) bool { return x >= limit } }
	var p50 func(Run) float64 // pooled samples
	rate := func(x Run) float64 { return x.Rate }
	pingGoal := map[string]float64{"none": -45, "sidecar": -40, "sidecar-tls": -40}
	if goal, ok := pingGoal[mesh]; ok {
		add(WPaced+" p50", r.change(mesh, WPaced, p50), "%", fmt.Sprintf("<= %+.0f%%", goal), atMost(goal), !quick)
		add(WB2B+" p50", r.change(mesh, WB2B, p50), "%", fmt.Sprintf("<= %+.0f%%", goal), atMost(goal), true)
	}
	// Back-to-back RPS is the inverse of the mean round trip: a quick run
	// judges the latency instead, whose change is bounded.
	add(WB2B+" RPS", r.change(mesh, WB2B, rate), "%", ">= +80%", atLeast(80), !quick)
	add(WHTTP+" RPS", r.change(mesh, WHTTP, rate), "%", ">= +80%", atLeast(80), !quick)
	// Quick: one shared CPU makes the transfer pass the unread bound (see
	// transferSwitches); the full run judges FCT.
	add("file-transfer FCT", r.change(mesh, WTransfer, func(x Run) float64 { return x.FCT }), "%", "<= -45% (0.55x)", atMost(-45), !quick)
	// A throughput change of +80% repeats to ±5 points only if each mode's
	// rate does to about ±2.5%: more than a minute of short redis runs on
	// a shared machine gives. A quick run shows redis p50 instead.
	add("redis OPS", r.change(mesh, WRedis, rate), "%", ">= +40%", atLeast(40), !quick)
	// System-wide CPU seconds move with everything else on the machine.
	if quick {
		add("CPU s/op", Spread{}, "%", "<= +0%", nil, false)
	} else {
		for _, w := range Workloads {
			add(w+" CPU s/op", r.change(mesh, w, Run.CPUPerOp), "%", "<= +0%", atMost(0), true)
		}
	}
	if m := r.bpfMemory(mesh); !math.IsNaN(m) {
		add("datapath memory (BPF maps + programs)", Spread{m, m, m, 1}, "MB", "< 25 MB", func(x float64) bool { return x < 25 }, true)
	}
	return ts
}
