package mesh

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
)

// Report is computed from a results directory's raw runs alone, so it
// can be rendered again later (`eztunnel bench lab --report DIR`).
type Report struct {
	Facts    Facts
	Runs     []Run
	Meshes   []string
	Targets  []Target
	Verified bool // every eztunnel run paired at least one connection; every paired phase's counters match its side
	// Paired ping-echo by mesh (paired.go); its b2b p50 rows and target
	// come from it.
	Paired map[string]PairedB2B
}

// Target is one goal of the issue, evaluated for one mesh mode: Value is
// the paired change (eztunnel vs baseline, one pair per round) with its
// 95% interval, AA that of the rounds' two baseline runs; with Unit "MB"
// Value.Median is a single observation (no interval).
type Target struct {
	Mesh    string
	Name    string
	Value   bench.Paired
	AA      bench.Paired
	Unit    string // "%" or "MB"
	Goal    string
	Verdict string // bench.Pass, bench.Miss, bench.NotJudged or notJudged (--quick)
	Reason  string // why bench.NotJudged
}

// errNoRuns: a results directory without raw runs (a run that measured
// only the paired ping-echo has none).
var errNoRuns = errors.New("no raw results")

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
		return nil, facts, fmt.Errorf("%w in %s", errNoRuns, filepath.Join(dir, "raw"))
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
	if err != nil && !errors.Is(err, errNoRuns) {
		return nil, err
	}
	paired, err := LoadPaired(dir)
	if err != nil {
		return nil, err
	}
	rep := NewReport(runs, facts, paired)
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

// NewReport orders the meshes and evaluates the targets; paired are the
// paired ping-echo results by mesh (nil: none).
func NewReport(runs []Run, facts Facts, paired map[string]PairedB2B) *Report {
	r := &Report{Facts: facts, Runs: runs, Verified: true, Paired: paired}
	seen := map[string]bool{}
	for _, p := range paired {
		if !p.Verified() {
			r.Verified = false
		}
	}
	for _, m := range facts.Options.Meshes {
		_, ok := paired[m]
		if !seen[m] && (ok || r.has(m)) {
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

// sides returns, for every round that has both, the per-run values of
// modes a and b: the runs of a round are adjacent in time, so each pair
// saw the same machine.
func (r *Report) sides(mesh, workload, a, b string, f func(Run) float64) (xs, ys []float64) {
	as := map[int]float64{}
	for _, run := range r.runs(mesh, a, workload) {
		as[run.Rep] = f(run)
	}
	for _, run := range r.runs(mesh, b, workload) {
		if x, ok := as[run.Rep]; ok {
			xs, ys = append(xs, x), append(ys, f(run))
		}
	}
	return xs, ys
}

// Spread is the median and range of values (memory, MB).
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

// seed of the bootstrap: fixed, so a report renders alike from its raw
// runs.
const seed = 37

func runP50(x Run) float64 { return x.Latency.P50 }

// change of a value from baseline to eztunnel: the median of the
// per-round paired differences with its 95% bootstrap interval (with f
// nil, of the runs' latency p50). Pairing the adjacent runs of a round
// cancels slow drift of the machine.
func (r *Report) change(mesh, workload string, f func(Run) float64) bench.Paired {
	if f == nil {
		f = runP50
	}
	b, e := r.sides(mesh, workload, ModeBaseline, ModeEztunnel, f)
	return bench.TryPaired(b, e, seed)
}

// aa is change for the rounds' two baseline runs (A/A): it must hold 0
// within ±bench.AAMaxHalfWidth for the metric's targets to be judged.
func (r *Report) aa(mesh, workload string, f func(Run) float64) bench.Paired {
	if f == nil {
		f = runP50
	}
	a1, a2 := r.sides(mesh, workload, ModeAA1, ModeAA2, f)
	return bench.TryPaired(a1, a2, seed)
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
	add := func(name, workload string, f func(Run) float64, limit float64, atLeast, judged bool) {
		t := Target{Mesh: mesh, Name: name, Unit: "%", Goal: fmt.Sprintf("upper end <= %+.0f%%", limit)}
		if atLeast {
			t.Goal = fmt.Sprintf("lower end >= %+.0f%%", limit)
		}
		switch {
		case !judged:
			t.Verdict = notJudged
		case len(r.runs(mesh, ModeEztunnel, workload)) == 0:
			return // not measured
		default:
			t.Value, t.AA = r.change(mesh, workload, f), r.aa(mesh, workload, f)
			t.Verdict, t.Reason = bench.Judge(t.Value, t.AA, limit, atLeast)
		}
		ts = append(ts, t)
	}
	var p50 func(Run) float64 // per-run latency p50
	rate := func(x Run) float64 { return x.Rate }
	pingGoal := map[string]float64{"none": -45, "sidecar": -40, "sidecar-tls": -40}
	if goal, ok := pingGoal[mesh]; ok {
		add(WPaced+" p50", WPaced, p50, goal, false, !quick)
	}
	// Issue 39 adds ambient's back-to-back goal.
	b2bGoal := map[string]float64{"none": -45, "sidecar": -40, "sidecar-tls": -40, "ambient": -40, "ambient-tls": -40}
	if p, ok := r.Paired[mesh]; ok {
		t := Target{Mesh: mesh, Name: WB2B + " p50 (paired phases" + p.naiveLabel() + ")", Unit: "%", Goal: fmt.Sprintf("upper end <= %+.0f%%", b2bGoal[mesh]),
			Value: p.AB(), AA: p.AA()}
		t.Verdict, t.Reason = bench.Judge(t.Value, t.AA, b2bGoal[mesh], false)
		if _, ok := b2bGoal[mesh]; !ok {
			t.Goal, t.Verdict = "-", "no goal"
		}
		ts = append(ts, t)
	} else if goal, ok := b2bGoal[mesh]; ok {
		add(WB2B+" p50", WB2B, p50, goal, false, true)
	}
	// Back-to-back RPS is the inverse of the mean round trip: a quick run
	// judges the latency instead, whose change is bounded.
	add(WB2B+" RPS", WB2B, rate, 80, true, !quick)
	add(WHTTP+" RPS", WHTTP, rate, 80, true, !quick)
	// Quick: one shared CPU makes the transfer pass the unread bound (see
	// transferSwitches); the full run judges FCT (0.55x).
	add("file-transfer FCT", WTransfer, func(x Run) float64 { return x.FCT }, -45, false, !quick)
	// A throughput change of +80% repeats to ±5 points only if each mode's
	// rate does to about ±2.5%: more than a minute of short redis runs on
	// a shared machine gives. A quick run shows redis p50 instead.
	add("redis OPS", WRedis, rate, 40, true, !quick)
	// System-wide CPU seconds move with everything else on the machine.
	if quick {
		add("CPU s/op", "", nil, 0, false, false)
	} else {
		for _, w := range Workloads {
			add(w+" CPU s/op", w, Run.CPUPerOp, 0, false, true)
		}
	}
	if m := r.bpfMemory(mesh); !math.IsNaN(m) {
		// The largest of the eztunnel runs' readings: a single
		// observation, no interval.
		t := Target{Mesh: mesh, Name: "datapath memory (BPF maps + programs)", Value: bench.Paired{Pairs: 1, Median: m, Lo: m, Hi: m},
			Unit: "MB", Goal: "< 25 MB", Verdict: bench.Miss}
		if m < 25 {
			t.Verdict = bench.Pass
		}
		ts = append(ts, t)
	}
	return ts
}
