package tracer

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/eztunnel/eztunnel/internal/stats"
)

// Report accumulates per-stage latencies of the records it is given.
type Report struct {
	Packets int
	ByEnd   map[End]int
	// paths counts lifetimes by the stages they went through (a fast path
	// such as the bridge bypass skips stages the kernel path has).
	paths map[string]*Path
	stage map[Stage][]float64 // µs of the segment ending at the stage
	nf    map[int][]float64   // µs inside a netfilter slot, when non-zero
	parts map[string][]float64
}

// NewReport is empty.
func NewReport() *Report {
	return &Report{ByEnd: map[End]int{}, stage: map[Stage][]float64{}, nf: map[int][]float64{}, parts: map[string][]float64{}, paths: map[string]*Path{}}
}

// Add accounts one record.
func (p *Report) Add(r *Record) {
	p.Packets++
	p.ByEnd[r.End]++
	st := r.Stages()
	key := fmt.Sprint(st)
	pa, ok := p.paths[key]
	if !ok {
		pa = &Path{Stages: st}
		p.paths[key] = pa
	}
	pa.Packets++
	pa.total = append(pa.total, us(r.Total()))
	for _, s := range r.Segments() {
		p.stage[s.Stage] = append(p.stage[s.Stage], us(s.NS))
	}
	for i, v := range r.NF {
		if v != 0 {
			p.nf[i] = append(p.nf[i], us(uint64(v)))
		}
	}
	out, host, in := r.Split()
	for name, v := range map[string]uint64{"pod out": out, "host": host, "pod in": in, "total": r.Total()} {
		if v != 0 || name == "total" {
			p.parts[name] = append(p.parts[name], us(v))
		}
	}
}

func us(ns uint64) float64 { return float64(ns) / 1e3 }

// Row is one line of the summary.
type Row struct {
	Name string
	stats.Summary
}

// Rows summarises every stage, netfilter slot and part, in path order.
func (p *Report) Rows() []Row {
	var rows []Row
	var stages []Stage
	for s := range p.stage {
		stages = append(stages, s)
	}
	sort.Slice(stages, func(i, j int) bool { return stages[i] < stages[j] })
	for _, s := range stages {
		rows = append(rows, Row{"-> " + s.String(), stats.Summarize(p.stage[s])})
	}
	var slots []int
	for i := range p.nf {
		slots = append(slots, i)
	}
	sort.Ints(slots)
	for _, i := range slots {
		rows = append(rows, Row{"nf " + NFSlotName(i), stats.Summarize(p.nf[i])})
	}
	for _, name := range []string{"pod out", "host", "pod in", "total"} {
		if xs, ok := p.parts[name]; ok {
			rows = append(rows, Row{name, stats.Summarize(xs)})
		}
	}
	return rows
}

// Part returns the samples (µs) of "pod out", "host", "pod in" or "total".
func (p *Report) Part(name string) []float64 { return p.parts[name] }

// Path is the lifetimes that went through the same stages.
type Path struct {
	Stages  []Stage `json:"stages"`
	Packets int     `json:"packets"`
	// Saved are the stages of the longest path (most stages; on a tie the
	// one with the most packets) this one skipped, in path order.
	Saved []Stage       `json:"saved"`
	Total stats.Summary `json:"total_us"` // from first to last stage
	total []float64
}

// Paths lists the paths seen, most packets first, each with the stages it
// saved against the longest one: the kernel path, when a fast path (the
// bridge bypass, the socket shortcut) carried some of the packets.
func (p *Report) Paths() []Path {
	var out []Path
	var longest *Path
	for _, pa := range p.paths {
		if longest == nil || len(pa.Stages) > len(longest.Stages) ||
			len(pa.Stages) == len(longest.Stages) && pa.Packets > longest.Packets {
			longest = pa
		}
	}
	for _, pa := range p.paths {
		c := *pa
		c.Total = stats.Summarize(pa.total)
		c.total = nil
		c.Saved = nil
		for _, s := range longest.Stages {
			if !slices.Contains(pa.Stages, s) {
				c.Saved = append(c.Saved, s)
			}
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Packets != out[j].Packets {
			return out[i].Packets > out[j].Packets
		}
		return fmt.Sprint(out[i].Stages) < fmt.Sprint(out[j].Stages)
	})
	return out
}

// maxPaths is how many paths Write prints.
const maxPaths = 8

// Write prints the table: per-stage percentiles and PDV = P99 - P1, in µs;
// then, when the lifetimes took more than one path, each path with the
// stages it saved against the longest (the kernel path).
func (p *Report) Write(w io.Writer) error {
	if err := p.writeStages(w); err != nil {
		return err
	}
	paths := p.Paths()
	if len(paths) < 2 {
		return nil
	}
	fmt.Fprintf(w, "\npaths (stages saved against the longest path; total µs)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "packets\tstages\tp50\tp99\tsaved\t\n")
	for i, pa := range paths {
		if i == maxPaths {
			fmt.Fprintf(tw, "(%d more paths)\t\t\t\t\t\n", len(paths)-maxPaths)
			break
		}
		saved := "-"
		if len(pa.Saved) > 0 {
			var names []string
			for _, s := range pa.Saved {
				names = append(names, s.String())
			}
			saved = strings.Join(names, " ")
		}
		fmt.Fprintf(tw, "%d\t%d\t%.2f\t%.2f\t%s\t\n", pa.Packets, len(pa.Stages), pa.Total.P50, pa.Total.P99, saved)
	}
	return tw.Flush()
}

func (p *Report) writeStages(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "stage (µs)\tn\tp1\tp50\tp99\tmax\tPDV\t\n")
	for _, r := range p.Rows() {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", r.Name, r.N, r.P1, r.P50, r.P99, r.Max, r.PDV)
	}
	return tw.Flush()
}
