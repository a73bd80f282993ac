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

// Row is one metric: Baseline and Accelerated are medians over the
// rounds' A/B phases, Change the paired comparison of those phases
// (accelerated vs baseline, one pair per round) and AA that of the
// rounds' two baseline phases. NaN marks a cell that does not apply.
type Row struct {
	Name                  string
	Baseline, Accelerated float64
	Change, AA            bench.Paired
	Digits                int
}

// Target is one goal of the project: a change (%) whose 95% interval must
// lie at or below Limit, judged only when the A/A interval of the same
// metric holds 0 within ±bench.AAMaxHalfWidth.
type Target struct {
	Name    string
	Value   bench.Paired
	AA      bench.Paired
	Limit   float64
	Verdict string // bench.Pass, bench.Miss or bench.NotJudged
	Reason  string // why not judged
}

// Report is what Quick prints, computed from its Results.
type Report struct {
	Options  Options
	Rows     []Row
	Targets  []Target
	Counters datapath.Counters // accelerated phases, summed over rounds
	Pairs    []uint64          // pairs made per round
	Verified bool              // every accelerated phase paired connections
}

// seed of the bootstrap: fixed, so a report can be recomputed from
// quick.json.
const seed = 37

// NewReport compares the rounds' phases pairwise and judges the targets.
func NewReport(res Results) Report {
	col := func(f func(Round) float64) []float64 {
		xs := make([]float64, len(res.Rounds))
		for i, rd := range res.Rounds {
			xs[i] = f(rd)
		}
		return xs
	}
	med := func(xs []float64) float64 {
		if len(xs) == 0 {
			return math.NaN()
		}
		return stats.Summarize(xs).P50
	}
	row := func(name string, digits int, f func(Measurement) float64) Row {
		base, acc := col(func(r Round) float64 { return f(r.Baseline) }), col(func(r Round) float64 { return f(r.Accelerated) })
		aa0, aa1 := col(func(r Round) float64 { return f(r.AA[0]) }), col(func(r Round) float64 { return f(r.AA[1]) })
		return Row{Name: name, Baseline: med(base), Accelerated: med(acc), Digits: digits,
			Change: bench.TryPaired(base, acc, seed), AA: bench.TryPaired(aa0, aa1, seed)}
	}
	size := sizeLabel(res.Options.TransferBytes)
	rep := Report{Options: res.Options, Counters: datapath.Counters{}, Verified: len(res.Rounds) > 0}
	unix := col(func(r Round) float64 { return r.Unix.P50 })
	none := bench.TryPaired(nil, nil, seed)
	rep.Rows = []Row{
		row("RTT 24 B p50 (us)", 1, func(m Measurement) float64 { return m.RTT24.P50 }),
		row("RTT 24 B p99 (us)", 1, func(m Measurement) float64 { return m.RTT24.P99 }),
		row("RTT 64 KiB p50 (us)", 1, func(m Measurement) float64 { return m.RTT64K.P50 }),
		row("RTT 64 KiB p99 (us)", 1, func(m Measurement) float64 { return m.RTT64K.P99 }),
		row(size+" FCT (s)", 2, func(m Measurement) float64 { return m.FCT }),
		row("node TCP mem peak (MiB)", 1, func(m Measurement) float64 { return float64(m.TCPMemPeak) / (1 << 20) }),
		{Name: "unix socket RTT 24 B p50 (us)", Baseline: med(unix), Accelerated: math.NaN(), Change: none, AA: none, Digits: 1},
	}
	rtt, fct := rep.Rows[0], rep.Rows[4]
	rep.Targets = []Target{
		target("p50 RTT at least 45% lower (24 B)", rtt.Change, rtt.AA, -45),
		// The unix floor against the same round's accelerated phase; the
		// A/A of the 24 B round trip says whether such a change resolves.
		target("accelerated 24 B p50 at most 15% above unix socketpair p50 (1.15x)",
			bench.TryPaired(unix, col(func(r Round) float64 { return r.Accelerated.RTT24.P50 }), seed), rtt.AA, 15),
		target(size+" FCT at least 45% lower (0.55x baseline)", fct.Change, fct.AA, -45),
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

func target(name string, value, aa bench.Paired, limit float64) Target {
	t := Target{Name: name, Value: value, AA: aa, Limit: limit}
	t.Verdict, t.Reason = bench.Judge(value, aa, limit, false)
	return t
}

// Write prints the comparison, the targets and the datapath counters.
func (r Report) Write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\neztunnel bench quick: %d round(s) of four phases on fresh connections, client and server on CPU %s\n"+
		"baseline, accelerated: medians over the rounds' A/B phases; change: median of the per-round paired differences\n"+
		"(accelerated vs baseline) [95%% bootstrap interval]; A/A: the same for each round's two baseline phases\n\n",
		len(r.Pairs), cpuLabel(r.Options.CPU))
	var rows [][]string
	for _, row := range r.Rows {
		rows = append(rows, []string{row.Name, bench.Num(row.Baseline, row.Digits), bench.Num(row.Accelerated, row.Digits),
			row.Change.Cell(), row.AA.Cell()})
	}
	bench.WriteTable(&b, []string{"metric", "baseline", "accelerated", "change [95% CI]", "A/A [95% CI]"}, rows)
	b.WriteString("\n")
	rows = nil
	var notes []string
	for _, t := range r.Targets {
		rows = append(rows, []string{t.Name, t.Value.Cell(), t.AA.Cell(), fmt.Sprintf("upper end <= %+.0f%%", t.Limit), t.Verdict})
		if t.Reason != "" {
			notes = append(notes, fmt.Sprintf("%s %q: %s", bench.NotJudged, t.Name, t.Reason))
		}
	}
	bench.WriteTable(&b, []string{"target", "change [95% CI]", "A/A [95% CI]", "goal", "result"}, rows)
	for _, n := range notes {
		b.WriteString(n + "\n")
	}

	fmt.Fprintf(&b, "\ndatapath counters, accelerated phases (delta over all rounds):")
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
