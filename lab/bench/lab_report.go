package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/eztunnel/eztunnel/internal/stats"
)

// LabReport is computed from a results directory's raw runs alone, so it
// can be rendered again later (`eztunnel bench lab --report DIR`).
type LabReport struct {
	Facts    Facts
	Runs     []LabRun
	Meshes   []string
	Targets  []LabTarget
	Verified bool // every eztunnel run paired at least one connection
}

// LabTarget is one goal of the issue, evaluated for one mesh mode.
type LabTarget struct {
	Mesh  string
	Name  string
	Value float64
	Unit  string // "%", "x" or "MB"
	Goal  string
	Pass  bool
}

// LoadLab reads machine.json and every raw/*.json of a results directory.
func LoadLab(dir string) ([]LabRun, Facts, error) {
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
	var runs []LabRun
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, facts, err
		}
		var r LabRun
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, facts, fmt.Errorf("%s: %w", f, err)
		}
		runs = append(runs, r)
	}
	return runs, facts, nil
}

// RenderLabReport loads a results directory and writes summary.md,
// runs.csv and the plots into it.
func RenderLabReport(dir string) (*LabReport, error) {
	runs, facts, err := LoadLab(dir)
	if err != nil {
		return nil, err
	}
	rep := NewLabReport(runs, facts)
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

// NewLabReport orders the meshes and evaluates the targets.
func NewLabReport(runs []LabRun, facts Facts) *LabReport {
	r := &LabReport{Facts: facts, Runs: runs, Verified: true}
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

func (r *LabReport) has(mesh string) bool {
	for _, run := range r.Runs {
		if run.Mesh == mesh {
			return true
		}
	}
	return false
}

// runs selects the runs of one mesh, mode and workload, in repetition order.
func (r *LabReport) runs(mesh, mode, workload string) []LabRun {
	var out []LabRun
	for _, run := range r.Runs {
		if run.Mesh == mesh && run.Mode == mode && run.Workload == workload {
			out = append(out, run)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rep < out[j].Rep })
	return out
}

// perRun summarizes one value of every run (quartiles over repetitions).
func (r *LabReport) perRun(mesh, mode, workload string, f func(LabRun) float64) stats.Summary {
	var xs []float64
	for _, run := range r.runs(mesh, mode, workload) {
		xs = append(xs, f(run))
	}
	return stats.Summarize(xs)
}

// pooled summarizes every latency sample of every repetition together.
func (r *LabReport) pooled(mesh, mode, workload string) stats.Summary {
	var xs []float64
	for _, run := range r.runs(mesh, mode, workload) {
		xs = append(xs, run.Samples...)
	}
	return stats.Summarize(xs)
}

// median of one per-run value; NaN when there are no runs.
func (r *LabReport) median(mesh, mode, workload string, f func(LabRun) float64) float64 {
	s := r.perRun(mesh, mode, workload, f)
	if s.N == 0 {
		return math.NaN()
	}
	return s.P50
}

// pairMedians returns the baseline and eztunnel medians of a value.
func (r *LabReport) pairMedians(mesh, workload string, f func(LabRun) float64) (float64, float64) {
	return r.median(mesh, ModeBaseline, workload, f), r.median(mesh, ModeEztunnel, workload, f)
}

// pooledP50 returns baseline and eztunnel p50 of the pooled samples.
func (r *LabReport) pooledP50(mesh, workload string) (float64, float64) {
	b, e := r.pooled(mesh, ModeBaseline, workload), r.pooled(mesh, ModeEztunnel, workload)
	if b.N == 0 || e.N == 0 {
		return math.NaN(), math.NaN()
	}
	return b.P50, e.P50
}

// memDelta is the eztunnel minus baseline median of MemTotal-MemAvailable
// over every run of a mesh, in MB.
func (r *LabReport) memDelta(mesh string) float64 {
	var b, e []float64
	for _, run := range r.Runs {
		if run.Mesh != mesh {
			continue
		}
		if run.Mode == ModeBaseline {
			b = append(b, run.MemUsed)
		} else {
			e = append(e, run.MemUsed)
		}
	}
	if len(b) == 0 || len(e) == 0 {
		return math.NaN()
	}
	return stats.Summarize(e).P50 - stats.Summarize(b).P50
}

// bpfMaps is the largest map memory of a mesh's eztunnel runs, in MB.
func (r *LabReport) bpfMaps(mesh string) float64 {
	m := math.NaN()
	for _, run := range r.Runs {
		if run.Mesh == mesh && run.Mode == ModeEztunnel && (math.IsNaN(m) || run.BPFMaps > m) {
			m = run.BPFMaps
		}
	}
	return m
}

func (r *LabReport) targets(mesh string) []LabTarget {
	var ts []LabTarget
	lower := func(name string, b, e, limit float64) {
		c := stats.Change(b, e)
		ts = append(ts, LabTarget{mesh, name, c, "%", fmt.Sprintf("<= %+.0f%%", limit), c <= limit})
	}
	higher := func(name string, b, e, limit float64) {
		c := stats.Change(b, e)
		ts = append(ts, LabTarget{mesh, name, c, "%", fmt.Sprintf(">= %+.0f%%", limit), c >= limit})
	}
	pingGoal := map[string]float64{"none": -45, "sidecar": -40, "sidecar-tls": -40}
	if goal, ok := pingGoal[mesh]; ok {
		for _, w := range []string{WPaced, WB2B} {
			if b, e := r.pooledP50(mesh, w); !math.IsNaN(b) {
				lower(w+" p50", b, e, goal)
			}
		}
	}
	rate := func(x LabRun) float64 { return x.Rate }
	for _, w := range []string{WB2B, WHTTP} {
		if b, e := r.pairMedians(mesh, w, rate); !math.IsNaN(b) {
			higher(w+" RPS", b, e, 80)
		}
	}
	if b, e := r.pairMedians(mesh, WTransfer, func(x LabRun) float64 { return x.FCT }); !math.IsNaN(b) {
		x := ratio(e, b)
		ts = append(ts, LabTarget{mesh, "file-transfer FCT", x, "x", "<= 0.55x", x <= 0.55})
	}
	if b, e := r.pairMedians(mesh, WRedis, rate); !math.IsNaN(b) {
		higher("redis OPS", b, e, 40)
	}
	for _, w := range LabWorkloads {
		if b, e := r.pairMedians(mesh, w, LabRun.CPUPerOp); !math.IsNaN(b) {
			lower(w+" CPU s/op", b, e, 0)
		}
	}
	if d := r.memDelta(mesh); !math.IsNaN(d) {
		ts = append(ts, LabTarget{mesh, "memory added (system)", d, "MB", "< 25 MB", d < 25})
	}
	if m := r.bpfMaps(mesh); !math.IsNaN(m) {
		ts = append(ts, LabTarget{mesh, "BPF map memory", m, "MB", "< 25 MB", m < 25})
	}
	return ts
}
