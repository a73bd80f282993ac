package bench

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/eztunnel/eztunnel/internal/stats"
)

// quartileTable is one table in the dissertation's layout: per mesh mode a
// Baseline and an eZtunnel row with p25, p50, average and p75, eZtunnel
// cells carrying the change against the baseline.
type quartileTable struct {
	title    string
	workload string
	pooled   bool                 // quartiles of all latency samples; else of per-run values
	value    func(LabRun) float64 // per-run value when not pooled
	digits   int
	absolute bool // change as a difference (memory), not a percentage
}

var labTables = []quartileTable{
	{title: "Latency of ping-echo, paced every 100 ms (us)", workload: WPaced, pooled: true, digits: 1},
	{title: "Latency of ping-echo, back to back (us)", workload: WB2B, pooled: true, digits: 1},
	{title: "Jitter (population std. dev.) of paced ping-echo, per run (us)", workload: WPaced, value: func(r LabRun) float64 { return r.Latency.StdDev }, digits: 1},
	{title: "Jitter (PDV = P99 - P1) of paced ping-echo, per run (us)", workload: WPaced, value: func(r LabRun) float64 { return r.Latency.PDV }, digits: 1},
	{title: "Latency p99.9 of back-to-back ping-echo, per run (us)", workload: WB2B, value: func(r LabRun) float64 { return r.Latency.P999 }, digits: 1},
	{title: "Requests per second (RPS) of back-to-back ping-echo", workload: WB2B, value: func(r LabRun) float64 { return r.Rate }, digits: 0},
	{title: "Flow Completion Time (FCT) of file-transfer (s)", workload: WTransfer, value: func(r LabRun) float64 { return r.FCT }, digits: 3},
	{title: "Operations per second (OPS) of redis", workload: WRedis, value: func(r LabRun) float64 { return r.Rate }, digits: 0},
	{title: "Latency p50 of redis, per run (us)", workload: WRedis, value: func(r LabRun) float64 { return r.Latency.P50 }, digits: 1},
	{title: "Requests per second (RPS) of http (nginx + wrk)", workload: WHTTP, value: func(r LabRun) float64 { return r.Rate }, digits: 0},
	{title: "Latency p50 of http, per run (us)", workload: WHTTP, value: func(r LabRun) float64 { return r.Latency.P50 }, digits: 1},
}

func (r *LabReport) writeQuartiles(b *strings.Builder, t quartileTable) {
	fmt.Fprintf(b, "\n### %s\n\n", t.title)
	header := []string{"Service Mesh", "Mode", "p25", "p50", "average", "p75"}
	var rows [][]string
	for _, mesh := range r.Meshes {
		var sums [2]stats.Summary
		for i, mode := range []string{ModeBaseline, ModeEztunnel} {
			if t.pooled {
				sums[i] = r.pooled(mesh, mode, t.workload)
			} else {
				sums[i] = r.perRun(mesh, mode, t.workload, t.value)
			}
		}
		if sums[0].N == 0 && sums[1].N == 0 {
			continue
		}
		pick := func(s stats.Summary) []float64 { return []float64{s.P25, s.P50, s.Mean, s.P75} }
		base, ez := pick(sums[0]), pick(sums[1])
		brow := []string{mesh, "Baseline"}
		erow := []string{"", "eZtunnel"}
		for i := range base {
			brow = append(brow, cell(base[i], sums[0].N, t.digits))
			c := cell(ez[i], sums[1].N, t.digits)
			if sums[0].N > 0 && sums[1].N > 0 {
				if t.absolute {
					c += fmt.Sprintf(" (%+.1f)", ez[i]-base[i])
				} else {
					c += " (" + withUnit(stats.Change(base[i], ez[i]), "%") + ")"
				}
			}
			erow = append(erow, c)
		}
		rows = append(rows, brow, erow)
	}
	writeTable(b, header, rows)
}

func cell(x float64, n, digits int) string {
	if n == 0 {
		return "-"
	}
	return num(x, digits)
}

// writeCPUMemory writes the CPU and memory tables of one workload: CPU as
// the dissertation's single column (median over runs) plus per operation
// and the top processes; memory in the quartile layout with differences.
func (r *LabReport) writeCPUMemory(b *strings.Builder, w string) {
	fmt.Fprintf(b, "\n### CPU usage of %s (system-wide busy CPU seconds per run, median)\n\n", w)
	var rows [][]string
	for _, mesh := range r.Meshes {
		for i, mode := range []string{ModeBaseline, ModeEztunnel} {
			runs := r.runs(mesh, mode, w)
			if len(runs) == 0 {
				continue
			}
			cpu := r.median(mesh, mode, w, func(x LabRun) float64 { return x.CPU })
			perOp := r.median(mesh, mode, w, LabRun.CPUPerOp)
			c, p := num(cpu, 2), fmt.Sprintf("%.3g", perOp)
			name := mesh
			label := "Baseline"
			if i == 1 {
				bc, _ := r.pairMedians(mesh, w, func(x LabRun) float64 { return x.CPU })
				bp, _ := r.pairMedians(mesh, w, LabRun.CPUPerOp)
				c += " (" + withUnit(stats.Change(bc, cpu), "%") + ")"
				p += " (" + withUnit(stats.Change(bp, perOp), "%") + ")"
				name, label = "", "eZtunnel"
			}
			rows = append(rows, []string{name, label, c, p, topProcs(runs)})
		}
	}
	writeTable(b, []string{"Service Mesh", "Mode", "CPU (s)", "CPU s per op", "per process (s, median)"}, rows)
	r.writeQuartiles(b, quartileTable{title: "Memory used (MemTotal - MemAvailable) at the end of " + w + " runs (MB)",
		workload: w, value: func(x LabRun) float64 { return x.MemUsed }, digits: 1, absolute: true})
}

// topProcs lists the per-process CPU medians of the runs, largest first.
func topProcs(runs []LabRun) string {
	vals := map[string][]float64{}
	for _, run := range runs {
		for k, v := range run.ProcCPU {
			vals[k] = append(vals[k], v)
		}
	}
	type kv struct {
		k string
		v float64
	}
	var list []kv
	for k, xs := range vals {
		if m := stats.Summarize(xs).P50; m >= 0.005 {
			list = append(list, kv{k, m})
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].v > list[j].v })
	var parts []string
	for _, e := range list[:min(len(list), 4)] {
		parts = append(parts, fmt.Sprintf("%s %.2f", e.k, e.v))
	}
	return strings.Join(parts, ", ")
}

// WriteSummary writes summary.md.
func (r *LabReport) WriteSummary(w io.Writer) error {
	var b strings.Builder
	f := r.Facts
	b.WriteString("# eztunnel bench lab\n\n")
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %.0f MB, kernel %s, %s. Started %s.\n\n", f.CPUs, f.CPUModel, f.MemTotal, f.Kernel, f.Go, f.Started.Format("2006-01-02 15:04 MST"))
	var names []string
	for k := range f.Versions {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "- %s: `%s`\n", k, f.Versions[k])
	}
	o := f.Options
	fmt.Fprintf(&b, "\nOptions: meshes %s, %d repetition(s), baseline and eztunnel interleaved; paced ping-echo %d x 24 B every %s, back-to-back %d x 24 B, file-transfer %d MiB, redis %d requests per test (SET, GET) with %d clients, http %s with %d connections, CPUs %q.\n",
		strings.Join(o.Meshes, ", "), o.Reps, o.PacedN, o.Interval, o.PingN, o.TransferMiB, o.RedisN, o.RedisClients, o.HTTPDuration, o.HTTPConns, o.CPUs)
	b.WriteString("\n## Main results (medians)\n\n")
	b.WriteString(r.mainTable())
	b.WriteString("\n## Targets\n\n")
	b.WriteString(r.targetTable())
	b.WriteString("\n## Tables\n\nLatency tables pool every sample of every repetition; the other tables take quartiles over the repetitions' per-run values.\n")
	for _, t := range labTables {
		r.writeQuartiles(&b, t)
	}
	for _, wl := range LabWorkloads {
		if r.hasWorkload(wl) {
			r.writeCPUMemory(&b, wl)
		}
	}
	b.WriteString("\n## Acceleration\n\n")
	b.WriteString(r.acceleration())
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *LabReport) hasWorkload(w string) bool {
	for _, run := range r.Runs {
		if run.Workload == w {
			return true
		}
	}
	return false
}

// mainTable is the comparison `bench lab` prints: medians per mesh mode.
func (r *LabReport) mainTable() string {
	type metric struct {
		name, workload string
		digits         int
		pooled         bool
		f              func(LabRun) float64
	}
	rate := func(x LabRun) float64 { return x.Rate }
	metrics := []metric{
		{"ping-echo paced p50 (us)", WPaced, 1, true, nil},
		{"ping-echo b2b p50 (us)", WB2B, 1, true, nil},
		{"ping-echo b2b RPS", WB2B, 0, false, rate},
		{"file-transfer FCT (s)", WTransfer, 3, false, func(x LabRun) float64 { return x.FCT }},
		{"redis OPS", WRedis, 0, false, rate},
		{"redis p50 (us)", WRedis, 1, false, func(x LabRun) float64 { return x.Latency.P50 }},
		{"http RPS", WHTTP, 0, false, rate},
		{"http p50 (us)", WHTTP, 1, false, func(x LabRun) float64 { return x.Latency.P50 }},
	}
	var rows [][]string
	for _, mesh := range r.Meshes {
		first := true
		for _, m := range metrics {
			var b, e float64
			if m.pooled {
				b, e = r.pooledP50(mesh, m.workload)
			} else {
				b, e = r.pairMedians(mesh, m.workload, m.f)
			}
			if math.IsNaN(b) && math.IsNaN(e) {
				continue
			}
			name := ""
			if first {
				name, first = mesh, false
			}
			rows = append(rows, []string{name, m.name, num(b, m.digits), num(e, m.digits), withUnit(stats.Change(b, e), "%")})
		}
	}
	var b strings.Builder
	writeTable(&b, []string{"mesh", "metric", "baseline", "eztunnel", "change"}, rows)
	return b.String()
}

func (r *LabReport) targetTable() string {
	var rows [][]string
	for _, t := range r.Targets {
		v := withUnit(t.Value, t.Unit)
		if t.Unit == "MB" {
			v = fmt.Sprintf("%+.1f MB", t.Value)
			if t.Name == "BPF map memory" {
				v = fmt.Sprintf("%.1f MB", t.Value)
			}
		}
		verdict := "MISS"
		if t.Pass {
			verdict = "PASS"
		}
		rows = append(rows, []string{t.Mesh, t.Name, v, t.Goal, verdict})
	}
	var b strings.Builder
	writeTable(&b, []string{"mesh", "target", "value", "goal", "result"}, rows)
	return b.String()
}

// acceleration lists the datapath's pairs per eztunnel run.
func (r *LabReport) acceleration() string {
	var rows [][]string
	for _, mesh := range r.Meshes {
		for _, w := range LabWorkloads {
			runs := r.runs(mesh, ModeEztunnel, w)
			if len(runs) == 0 {
				continue
			}
			var pairs, fallback []string
			for _, run := range runs {
				pairs = append(pairs, strconv.FormatUint(run.Counters["pairs"], 10))
				var fb uint64
				for k, v := range run.Counters {
					if strings.HasPrefix(k, "fallback_") {
						fb += v
					}
				}
				fallback = append(fallback, strconv.FormatUint(fb, 10))
			}
			rows = append(rows, []string{mesh, w, strings.Join(pairs, ", "), strings.Join(fallback, ", ")})
		}
	}
	var b strings.Builder
	writeTable(&b, []string{"mesh", "workload", "pairs per run", "fallbacks per run"}, rows)
	if !r.Verified {
		b.WriteString("\nACCELERATION NOT VERIFIED: some eztunnel run paired no connection.\n")
	}
	return b.String()
}

// WriteMain prints the main table and the targets (what `make demo` shows).
func (r *LabReport) WriteMain(w io.Writer) error {
	reps := r.Facts.Options.Reps
	_, err := fmt.Fprintf(w, "\neztunnel bench lab: %d mesh mode(s) x %d repetition(s), medians\n\n%s\n%s",
		len(r.Meshes), reps, r.mainTable(), r.targetTable())
	return err
}

// WriteCSV writes one line per run.
func (r *LabReport) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"mesh", "mode", "rep", "workload", "p25_us", "p50_us", "mean_us", "p75_us", "p99_us", "p999_us",
		"stddev_us", "pdv_us", "fct_s", "rate", "ops", "seconds", "cpu_s", "cpu_s_per_op", "mem_used_mb", "bpf_maps_mb",
		"pairs", "bytes_redirected", "proc_cpu_s"})
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }
	for _, run := range r.Runs {
		l := run.Latency
		var procs []string
		for k, v := range run.ProcCPU {
			procs = append(procs, fmt.Sprintf("%s=%.3f", k, v))
		}
		sort.Strings(procs)
		cw.Write([]string{run.Mesh, run.Mode, strconv.Itoa(run.Rep), run.Workload, f(l.P25), f(l.P50), f(l.Mean), f(l.P75),
			f(l.P99), f(l.P999), f(l.StdDev), f(l.PDV), f(run.FCT), f(run.Rate), f(run.Ops), f(run.Seconds), f(run.CPU),
			f(run.CPUPerOp()), f(run.MemUsed), f(run.BPFMaps), strconv.FormatUint(run.Counters["pairs"], 10),
			strconv.FormatUint(run.Counters["bytes_redirected"], 10), strings.Join(procs, ";")})
	}
	cw.Flush()
	return cw.Error()
}

func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriter(f)
	if err := fn(bw); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
