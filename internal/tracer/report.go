package tracer

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/eztunnel/eztunnel/internal/stats"
)

// Report accumulates per-stage latencies of the records it is given.
type Report struct {
	Packets int
	ByEnd   map[End]int
	stage   map[Stage][]float64 // µs of the segment ending at the stage
	nf      map[int][]float64   // µs inside a netfilter slot, when non-zero
	parts   map[string][]float64
}

// NewReport is empty.
func NewReport() *Report {
	return &Report{ByEnd: map[End]int{}, stage: map[Stage][]float64{}, nf: map[int][]float64{}, parts: map[string][]float64{}}
}

// Add accounts one record.
func (p *Report) Add(r *Record) {
	p.Packets++
	p.ByEnd[r.End]++
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

// Write prints the table: per-stage percentiles and PDV = P99 - P1, in µs.
func (p *Report) Write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "stage (µs)\tn\tp1\tp50\tp99\tmax\tPDV\t\n")
	for _, r := range p.Rows() {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t\n", r.Name, r.N, r.P1, r.P50, r.P99, r.Max, r.PDV)
	}
	return tw.Flush()
}
