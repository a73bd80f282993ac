package quick

import (
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
)

// Row is one metric: medians over rounds. NaN marks a cell that does not apply.
type Row struct {
	Name                  string
	Baseline, Accelerated float64
	Digits                int
}

// Target is one goal of the project: Value must be at most Limit.
type Target struct {
	Name  string
	Value float64
	Limit float64
	Unit  string // "%" (a change) or "x" (a ratio)
	Pass  bool
}

// Report is what Quick prints, computed from its Results.
type Report struct {
	Options  Options
	Rows     []Row
	Targets  []Target
	Counters datapath.Counters // accelerated runs, summed over rounds
	Pairs    []uint64          // pairs made per round
	Verified bool              // every accelerated round paired connections
}

// NewReport takes medians over rounds and evaluates the targets.
func NewReport(res Results) Report {
	med := func(f func(Round) float64) float64 {
		xs := make([]float64, len(res.Rounds))
		for i, rd := range res.Rounds {
			xs[i] = f(rd)
		}
		if len(xs) == 0 {
			return math.NaN()
		}
		return stats.Summarize(xs).P50
	}
	row := func(name string, digits int, f func(Measurement) float64) Row {
		return Row{name, med(func(r Round) float64 { return f(r.Baseline) }),
			med(func(r Round) float64 { return f(r.Accelerated) }), digits}
	}
	size := sizeLabel(res.Options.TransferBytes)
	rep := Report{Options: res.Options, Counters: datapath.Counters{}, Verified: len(res.Rounds) > 0}
	rep.Rows = []Row{
		row("RTT 24 B p50 (us)", 1, func(m Measurement) float64 { return m.RTT24.P50 }),
		row("RTT 24 B p99 (us)", 1, func(m Measurement) float64 { return m.RTT24.P99 }),
		row("RTT 64 KiB p50 (us)", 1, func(m Measurement) float64 { return m.RTT64K.P50 }),
		row("RTT 64 KiB p99 (us)", 1, func(m Measurement) float64 { return m.RTT64K.P99 }),
		row(size+" FCT (s)", 2, func(m Measurement) float64 { return m.FCT }),
		row("node TCP mem peak (MiB)", 1, func(m Measurement) float64 { return float64(m.TCPMemPeak) / (1 << 20) }),
		{"unix socket RTT 24 B p50 (us)", med(func(r Round) float64 { return r.Unix.P50 }), math.NaN(), 1},
	}
	rtt, fct, unix := rep.Rows[0], rep.Rows[4], rep.Rows[6]
	rep.Targets = []Target{
		target("p50 RTT at least 45% lower (24 B)", stats.Change(rtt.Baseline, rtt.Accelerated), -45, "%"),
		target("accelerated 24 B p50 within 1.15x of unix socketpair p50", bench.Ratio(rtt.Accelerated, unix.Baseline), 1.15, "x"),
		target(size+" FCT at most 0.55x baseline", bench.Ratio(fct.Accelerated, fct.Baseline), 0.55, "x"),
	}
	for _, rd := range res.Rounds {
		for k, v := range rd.Counters {
			rep.Counters[k] += v
		}
		rep.Pairs = append(rep.Pairs, rd.Counters["pairs"])
		if rd.Counters["pairs"] == 0 {
			rep.Verified = false
		}
	}
	return rep
}

func target(name string, value, limit float64, unit string) Target {
	return Target{Name: name, Value: value, Limit: limit, Unit: unit, Pass: value <= limit} // NaN fails
}

// Write prints the comparison, the targets and the datapath counters.
func (r Report) Write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\neztunnel bench quick: median of %d round(s), client and server on CPU %s\n\n",
		len(r.Pairs), cpuLabel(r.Options.CPU))
	var rows [][]string
	for _, row := range r.Rows {
		rows = append(rows, []string{row.Name, bench.Num(row.Baseline, row.Digits), bench.Num(row.Accelerated, row.Digits),
			bench.WithUnit(stats.Change(row.Baseline, row.Accelerated), "%")})
	}
	bench.WriteTable(&b, []string{"metric", "baseline", "accelerated", "change"}, rows)
	b.WriteString("\n")
	rows = nil
	for _, t := range r.Targets {
		verdict := "MISS"
		if t.Pass {
			verdict = "PASS"
		}
		rows = append(rows, []string{t.Name, bench.WithUnit(t.Value, t.Unit), "<= " + bench.WithUnit(t.Limit, t.Unit), verdict})
	}
	bench.WriteTable(&b, []string{"target", "value", "goal", "result"}, rows)

	fmt.Fprintf(&b, "\ndatapath counters, accelerated runs (delta over all rounds):")
	for _, name := range datapath.CounterNames() {
		if v := r.Counters[name]; v != 0 {
			fmt.Fprintf(&b, " %s=%d", name, v)
		}
	}
	verdict := "acceleration verified"
	if !r.Verified {
		verdict = "ACCELERATION NOT VERIFIED"
	}
	fmt.Fprintf(&b, "\n%s: pairs per round %s (%d connections each)\n", verdict, joinUints(r.Pairs), connsPerMode)
	_, err := io.WriteString(w, b.String())
	return err
}

func joinUints(xs []uint64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

// sizeLabel names a byte count in the largest binary unit that divides it.
func sizeLabel(n uint64) string {
	for _, u := range []struct {
		shift uint
		name  string
	}{{30, "GiB"}, {20, "MiB"}, {10, "KiB"}} {
		if n >= 1<<u.shift && n%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d %s", n>>u.shift, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
