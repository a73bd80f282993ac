package mesh

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
	"github.com/eztunnel/eztunnel/lab/bench"
)

// quartileTable is one table in the dissertation's layout: per mesh mode a
// Baseline and an eZtunnel row with p25, p50, average and p75, eZtunnel
// cells carrying the change against the baseline.
type quartileTable struct {
	title    string
	workload string
	pooled   bool              // quartiles of all latency samples; else of per-run values
	value    func(Run) float64 // per-run value when not pooled
	digits   int
	absolute bool // change as a difference (memory), not a percentage
}

var tables = []quartileTable{
	{title: "Latency of ping-echo, paced every 100 ms (us)", workload: WPaced, pooled: true, digits: 1},
	{title: "Latency of ping-echo, back to back (us)", workload: WB2B, pooled: true, digits: 1},
	{title: "Jitter (population std. dev.) of paced ping-echo, per run (us)", workload: WPaced, value: func(r Run) float64 { return r.Latency.StdDev }, digits: 1},
	{title: "Jitter (PDV = P99 - P1) of paced ping-echo, per run (us)", workload: WPaced, value: func(r Run) float64 { return r.Latency.PDV }, digits: 1},
	{title: "Latency p99.9 of back-to-back ping-echo, per run (us)", workload: WB2B, value: func(r Run) float64 { return r.Latency.P999 }, digits: 1},
	{title: "Requests per second (RPS) of back-to-back ping-echo", workload: WB2B, value: func(r Run) float64 { return r.Rate }, digits: 0},
	{title: "Flow Completion Time (FCT) of file-transfer (s)", workload: WTransfer, value: func(r Run) float64 { return r.FCT }, digits: 3},
	{title: "Operations per second (OPS) of redis", workload: WRedis, value: func(r Run) float64 { return r.Rate }, digits: 0},
	{title: "Latency p50 of redis, per run (us)", workload: WRedis, value: func(r Run) float64 { return r.Latency.P50 }, digits: 1},
	{title: "Requests per second (RPS) of http (nginx + wrk)", workload: WHTTP, value: func(r Run) float64 { return r.Rate }, digits: 0},
	{title: "Latency p50 of http, per run (us)", workload: WHTTP, value: func(r Run) float64 { return r.Latency.P50 }, digits: 1},
}

func (r *Report) writeQuartiles(b *strings.Builder, t quartileTable) {
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
					c += " (" + bench.WithUnit(stats.Change(base[i], ez[i]), "%") + ")"
				}
			}
			erow = append(erow, c)
		}
		rows = append(rows, brow, erow)
	}
	bench.WriteTable(b, header, rows)
}

func cell(x float64, n, digits int) string {
	if n == 0 {
		return "-"
	}
	return bench.Num(x, digits)
}

// writeCPUMemory writes the CPU and memory tables of one workload: CPU as
// the dissertation's single column (median over runs) plus per operation
// and the top processes; memory in the quartile layout with differences.
func (r *Report) writeCPUMemory(b *strings.Builder, w string) {
	fmt.Fprintf(b, "\n### CPU usage of %s (system-wide busy CPU seconds per run, median)\n\n", w)
	var rows [][]string
	for _, mesh := range r.Meshes {
		for i, mode := range []string{ModeBaseline, ModeEztunnel} {
			runs := r.runs(mesh, mode, w)
			if len(runs) == 0 {
				continue
			}
			cpu := r.median(mesh, mode, w, func(x Run) float64 { return x.CPU })
			perOp := r.median(mesh, mode, w, Run.CPUPerOp)
			c, p := bench.Num(cpu, 2), fmt.Sprintf("%.3g", perOp)
			name := mesh
			label := "Baseline"
			if i == 1 {
				bc, _ := r.pairMedians(mesh, w, func(x Run) float64 { return x.CPU })
				bp, _ := r.pairMedians(mesh, w, Run.CPUPerOp)
				c += " (" + bench.WithUnit(stats.Change(bc, cpu), "%") + ")"
				p += " (" + bench.WithUnit(stats.Change(bp, perOp), "%") + ")"
				name, label = "", "eZtunnel"
			}
			rows = append(rows, []string{name, label, c, p, topProcs(runs)})
		}
	}
	bench.WriteTable(b, []string{"Service Mesh", "Mode", "CPU (s)", "CPU s per op", "per process (s, median)"}, rows)
	r.writeQuartiles(b, quartileTable{title: "TCP socket memory, peak rise during " + w + " runs (sockstat, system-wide, MB)",
		workload: w, value: func(x Run) float64 { return x.SockMem }, digits: 1, absolute: true})
}

// topProcs lists the per-process CPU medians of the runs, largest first.
func topProcs(runs []Run) string {
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
func (r *Report) WriteSummary(w io.Writer) error {
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
	fmt.Fprintf(&b, "\nOptions: meshes %s, %d round(s) of four runs (an A/A pair of baseline runs, an A/B pair of baseline and eztunnel; order alternating); paced ping-echo %d x 24 B every %s, back-to-back %d connection(s) x %d x 24 B, file-transfer %d MiB, redis %d requests per test (SET, GET) with %d clients, http %s with %d connections, CPUs %q, nice %d.\n",
		strings.Join(o.Meshes, ", "), o.Reps, o.PacedN, o.Interval, max(o.PingConns, 1), o.PingN, o.TransferMiB, o.RedisN, o.RedisClients, o.HTTPDuration, o.HTTPConns, o.CPUs, o.Nice)
	if o.PairQuads > 0 {
		fmt.Fprintf(&b, "Back-to-back ping-echo paired: %d quads of %s phases, %d fresh connections per phase; workloads in rounds: %s.\n",
			o.PairQuads, o.PairPhase, o.PairConns, strings.Join(o.Workloads, ", "))
	}
	b.WriteString("\n## Main results\n\n" + mainLegend + "\n\n")
	b.WriteString(r.mainTable())
	b.WriteString("\n## Targets\n\n")
	b.WriteString(r.targetTable())
	b.WriteString("\n## Memory\n\n")
	b.WriteString(r.memoryTable())
	b.WriteString("\n## Tables\n\nLatency tables pool every sample of every A/B run; the other tables take quartiles over the A/B runs' per-run values.\n")
	for _, t := range tables {
		r.writeQuartiles(&b, t)
	}
	for _, wl := range Workloads {
		if r.hasWorkload(wl) {
			r.writeCPUMemory(&b, wl)
		}
	}
	b.WriteString("\n## Acceleration\n\n")
	b.WriteString(r.acceleration())
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) hasWorkload(w string) bool {
	for _, run := range r.Runs {
		if run.Workload == w {
			return true
		}
	}
	return false
}

// mainLegend explains the main table's columns.
const mainLegend = "baseline, eztunnel: latency p50 of all samples pooled, other values trimmed means over the A/B runs (lowest and highest dropped from four on);\n" +
	"change: median of the per-round paired differences (eztunnel vs baseline, adjacent runs) [95% bootstrap interval];\n" +
	"A/A: the same for each round's two baseline runs; a target is judged only when its A/A holds 0 within ±2%"

// mainTable is the comparison `bench lab` prints: per mesh mode each
// mode's estimate (latency p50: of every sample pooled; others: trimmed
// mean over the A/B runs), the paired change with its 95% interval and
// the A/A comparison's. A quick run shows only what it measures stably.
func (r *Report) mainTable() string {
	type metric struct {
		name, workload string
		digits         int
		quick          bool
		f              func(Run) float64
	}
	rate := func(x Run) float64 { return x.Rate }
	p50 := func(x Run) float64 { return x.Latency.P50 }
	metrics := []metric{
		{"ping-echo paced p50 (us)", WPaced, 1, false, nil}, // pooled samples
		{"ping-echo b2b p50 (us)", WB2B, 1, true, nil},
		{"ping-echo b2b RPS", WB2B, 0, false, rate},
		// A quick run pins every process to one CPU: the writer runs a time
		// slice ahead, passes the unread bound and finishes on the kernel
		// path, so the FCT change is plain TCP against plain TCP (noise).
		// It shows how often the transfer left the shortcut instead.
		{"file-transfer FCT (s)", WTransfer, 3, false, func(x Run) float64 { return x.FCT }},
		{"redis OPS", WRedis, 0, false, rate},
		{"redis p50 (us)", WRedis, 1, true, p50},
		{"http RPS", WHTTP, 0, false, rate},
		{"http p50 (us)", WHTTP, 1, false, p50},
	}
	quick := r.Facts.Options.Quick
	var rows [][]string
	for _, mesh := range r.Meshes {
		first := true
		for _, m := range metrics {
			if quick && !m.quick {
				continue
			}
			row := r.mainRow(mesh, m.name, m.workload, m.digits, m.f)
			if row == nil {
				continue
			}
			if first {
				row[0], first = mesh, false
			}
			rows = append(rows, row)
		}
	}
	var b strings.Builder
	bench.WriteTable(&b, []string{"mesh", "metric", "baseline", "eztunnel", "change [95% CI]", "A/A [95% CI]"}, rows)
	b.WriteString(r.pairedNotes())
	if quick {
		b.WriteString(r.transferSwitches())
	}
	return b.String()
}

// mainRow is one metric's row of the main table (its mesh cell empty), nil
// when the mesh has no runs of it. The b2b p50 of a mesh with a paired
// ping-echo comes from its phases (baseline: A, the kernel path;
// eztunnel: B, the shortcut); every other row from rounds of runs.
func (r *Report) mainRow(mesh, name, workload string, digits int, f func(Run) float64) []string {
	if p, ok := r.Paired[mesh]; ok && workload == WB2B && f == nil {
		return []string{"", name + ", paired phases" + p.naiveLabel(), bench.Num(p.Median(bench.SideA), digits), bench.Num(p.Median(bench.SideB), digits),
			p.AB().Cell(), p.AA().Cell()}
	}
	b, e := r.estimate(mesh, ModeBaseline, workload, f), r.estimate(mesh, ModeEztunnel, workload, f)
	if math.IsNaN(b) && math.IsNaN(e) {
		return nil
	}
	if len(r.Paired) > 0 {
		name += fmt.Sprintf(", %d rounds", r.Facts.Options.Reps)
	}
	return []string{"", name, bench.Num(b, digits), bench.Num(e, digits), r.change(mesh, workload, f).Cell(), r.aa(mesh, workload, f).Cell()}
}

// pairedNotes describe the paired ping-echo of each mesh and what its
// counters prove: B phases accelerated, A phases not.
func (r *Report) pairedNotes() string {
	var b strings.Builder
	for i, mesh := range r.Meshes {
		p, ok := r.Paired[mesh]
		if !ok {
			continue
		}
		if i == 0 || b.Len() == 0 {
			fmt.Fprintf(&b, "ping-echo b2b, paired phases: %s\n", pairedLegend(p))
		}
		sum := func(k string, sides ...bench.Side) uint64 {
			var n uint64
			for _, s := range sides {
				n += p.Counters[s][k]
			}
			return n
		}
		as := []bench.Side{bench.SideA, bench.SideAA1, bench.SideAA2}
		verdict := "B accelerated, A not"
		if !p.Verified() {
			verdict = fmt.Sprintf("ACCELERATION NOT VERIFIED: %d B phase(s) not accelerated, %d A phase(s) accelerated", p.Unaccelerated, p.Accelerated)
		}
		fmt.Fprintf(&b, "  %s: %.0f s; B phases: %d connections paired, %d messages redirected (%d round trips); A and A/A phases: %d paired, %d redirected, %d excluded (%d round trips): %s\n",
			mesh, p.Second, sum("pairs", bench.SideB), sum("messages_redirected", bench.SideB), p.N[bench.SideB],
			sum("pairs", as...), sum("messages_redirected", as...), sum("fallback_excluded", as...),
			p.N[bench.SideA]+p.N[bench.SideAA1]+p.N[bench.SideAA2], verdict)
	}
	return b.String()
}

// transferSwitches counts the eztunnel file-transfer runs whose connection
// left the shortcut at the unread bound (fallback_backpressure).
func (r *Report) transferSwitches() string {
	var b strings.Builder
	for _, mesh := range r.Meshes {
		runs, switched := 0, 0
		for _, x := range r.Runs {
			if x.Mesh != mesh || x.Mode != ModeEztunnel || x.Workload != WTransfer {
				continue
			}
			runs++
			if x.Counters["fallback_backpressure"] > 0 {
				switched++
			}
		}
		if runs > 0 {
			fmt.Fprintf(&b, "file-transfer, %s: %d of %d eztunnel runs left the shortcut at the unread bound (fallback_backpressure); FCT then is plain TCP's (not judged by --quick)\n", mesh, switched, runs)
		}
	}
	return b.String()
}

// rangeOf prints min..max of a spread.
func rangeOf(s Spread, unit string) string {
	if s.N == 0 || math.IsNaN(s.Min) || math.IsNaN(s.Max) {
		return "-"
	}
	if unit == "MB" {
		return fmt.Sprintf("%.1f..%.1f", s.Min, s.Max)
	}
	return fmt.Sprintf("%+.1f..%+.1f%%", s.Min, s.Max)
}

// targetTable lists the targets, then why any was not judged.
func (r *Report) targetTable() string {
	var rows [][]string
	var notes []string
	for _, t := range r.Targets {
		v, aa := t.Value.Cell(), t.AA.Cell()
		switch {
		case t.Unit == "MB":
			v, aa = fmt.Sprintf("%.1f MB (single observation: largest run)", t.Value.Median), "-"
		case t.Verdict == notJudged:
			v, aa = "-", "-"
		}
		rows = append(rows, []string{t.Mesh, t.Name, v, aa, t.Goal, t.Verdict})
		if t.Reason != "" {
			notes = append(notes, fmt.Sprintf("%s %s %q: %s\n", bench.NotJudged, t.Mesh, t.Name, t.Reason))
		}
	}
	var b strings.Builder
	bench.WriteTable(&b, []string{"mesh", "target", "change [95% CI]", "A/A [95% CI]", "goal", "result"}, rows)
	for _, n := range notes {
		b.WriteString(n)
	}
	return b.String()
}

// memoryTable names each memory item: the datapath's own (BPF maps and
// programs, MapInfo/ProgramInfo.Memlock), the kernel memory of TCP sockets
// (peak rise during file-transfer, sockstat) and, as context only, the
// machine's MemTotal - MemAvailable.
func (r *Report) memoryTable() string {
	var rows [][]string
	for _, mesh := range r.Meshes {
		maps := r.memory(mesh, ModeEztunnel, "", func(x Run) float64 { return x.BPFMaps })
		progs := r.memory(mesh, ModeEztunnel, "", func(x Run) float64 { return x.BPFProgs })
		rows = append(rows, []string{mesh, "datapath BPF maps", "-", mb2(maps), "-"},
			[]string{"", "datapath BPF programs", "-", mb2(progs), "-"})
		sb := r.memory(mesh, ModeBaseline, WTransfer, func(x Run) float64 { return x.SockMem })
		se := r.memory(mesh, ModeEztunnel, WTransfer, func(x Run) float64 { return x.SockMem })
		if sb.N+se.N > 0 {
			rows = append(rows, []string{"", "TCP socket memory, peak rise in file-transfer (sockstat)", mb(sb), mb(se),
				rangeOf(sb, "MB") + " / " + rangeOf(se, "MB")})
		}
		cb := r.memory(mesh, ModeBaseline, "", func(x Run) float64 { return x.MemUsed })
		ce := r.memory(mesh, ModeEztunnel, "", func(x Run) float64 { return x.MemUsed })
		rows = append(rows, []string{"", "context: machine MemTotal-MemAvailable", mb(cb), mb(ce), rangeOf(cb, "MB") + " / " + rangeOf(ce, "MB")})
	}
	var b strings.Builder
	bench.WriteTable(&b, []string{"mesh", "memory (MB, median over runs)", "baseline", "eztunnel", "range (baseline / eztunnel)"}, rows)
	return b.String()
}

func mb2(s Spread) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", s.Median)
}

func mb(s Spread) string {
	if s.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", s.Median)
}

// acceleration lists the datapath's pairs per eztunnel run.
func (r *Report) acceleration() string {
	var rows [][]string
	for _, mesh := range r.Meshes {
		for _, w := range Workloads {
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
	bench.WriteTable(&b, []string{"mesh", "workload", "pairs per run", "fallbacks per run"}, rows)
	if !r.Verified {
		b.WriteString("\nACCELERATION NOT VERIFIED: some eztunnel run paired no connection.\n")
	}
	return b.String()
}

// WriteMain prints the main table, the targets and the memory items
// (what `make demo` shows).
func (r *Report) WriteMain(w io.Writer) error {
	o := r.Facts.Options
	place := "unpinned"
	if o.CPUs != "" {
		place = "every lab process on CPU " + o.CPUs
	}
	if o.Nice != 0 {
		place += fmt.Sprintf(" at nice %d", o.Nice)
	}
	kind := "full run"
	if o.Quick {
		kind = "quick run"
	}
	paired := ""
	if len(r.Paired) > 0 {
		paired = fmt.Sprintf("; ping-echo b2b instead in %d quads of paired phases per mesh (below)", o.PairQuads)
	}
	_, err := fmt.Fprintf(w, "\neztunnel bench lab (%s): %d mesh mode(s) x %d round(s) of four runs (an A/A pair of baseline runs, an A/B pair of baseline and eztunnel; order alternating)%s, %s\n"+
		"%s\n\n%s\n%s\n%s",
		kind, len(r.Meshes), o.Reps, paired, place, mainLegend, r.mainTable(), r.targetTable(), r.memoryTable())
	return err
}

// WriteCSV writes one line per run.
func (r *Report) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"mesh", "mode", "rep", "workload", "p25_us", "p50_us", "mean_us", "p75_us", "p99_us", "p999_us",
		"stddev_us", "pdv_us", "fct_s", "rate", "ops", "seconds", "cpu_s", "cpu_s_per_op", "mem_used_mb", "bpf_maps_mb", "bpf_progs_mb", "sock_mem_mb",
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
			f(run.CPUPerOp()), f(run.MemUsed), f(run.BPFMaps), f(run.BPFProgs), f(run.SockMem), strconv.FormatUint(run.Counters["pairs"], 10),
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
