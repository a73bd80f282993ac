package meshmatrix

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/bench/mesh"
)

// sample is one wrk run of one configuration at one concurrency, with what
// the agents did meanwhile.
type sample struct {
	round int
	wrk   mesh.WrkResult
	acc   counters
	cpu   cpuUse // the whole machine during the wrk run
}

// results of one routing mode: configuration -> concurrency -> samples in
// round order.
type results map[string]map[int][]sample

func (r results) add(cfg string, conc int, s sample) {
	if r[cfg] == nil {
		r[cfg] = map[int][]sample{}
	}
	r[cfg][conc] = append(r[cfg][conc], s)
}

// Minimal work per request for a configuration to count as accelerated.
// A request crosses four loopback legs (app <-> sidecar) and two cross-node
// legs (sidecar to sidecar); on each leg at least the request and the
// response travel. So a fully shortcut request moves at least 8 messages on
// sk_msg, and a fully bypassed one at least 8 packets (2 legs x 2 segments,
// each counted leaving one node and entering the other); the lab measures
// exactly 8.0 of each (ACKs ride on the next request or response). The
// thresholds are three quarters of that: a configuration that reaches less
// has measured a good part of the kernel path, and the run fails.
const (
	minRedirectedPerReq = 6.0
	minBypassedPerReq   = 6.0
)

// check fails a sample whose responses were not all intact, or whose
// agents did not do what configuration cfg is for.
func check(cfg string, s sample) error {
	w := s.wrk
	if w.Requests <= 0 {
		return fmt.Errorf("wrk completed no request")
	}
	if w.SocketErrors > 0 || w.Non2xx > 0 {
		return fmt.Errorf("wrk: %.0f socket errors, %.0f non-2xx/3xx responses of %.0f requests", w.SocketErrors, w.Non2xx, w.Requests)
	}
	red, byp := s.acc.redirected/w.Requests, s.acc.bypassed/w.Requests
	wantShortcut := cfg == ShortcutOnly || cfg == Both
	wantBypass := cfg == BypassOnly || cfg == Both
	switch {
	case wantShortcut && red < minRedirectedPerReq:
		return fmt.Errorf("%s: the shortcut moved %.2f messages per request (at least %.1f expected): not accelerated", cfg, red, minRedirectedPerReq)
	case !wantShortcut && (s.acc.redirected > 0 || s.acc.pairs > 0):
		return fmt.Errorf("%s: the shortcut paired %.0f connections and moved %.0f messages, none expected", cfg, s.acc.pairs, s.acc.redirected)
	case wantBypass && byp < minBypassedPerReq:
		return fmt.Errorf("%s: the bypass redirected %.2f packets per request (at least %.1f expected): not bypassed", cfg, byp, minBypassedPerReq)
	case !wantBypass && s.acc.bypassed > 0:
		return fmt.Errorf("%s: the bypass redirected %.0f packets, none expected", cfg, s.acc.bypassed)
	}
	return nil
}

// line is a sample's progress line.
func (s sample) line() string {
	w := s.wrk
	var b strings.Builder
	fmt.Fprintf(&b, "%.0f req/s, avg %.0f us, p50 %.0f us, p90 %.0f us, p99 %.0f us, %.0f requests, 0 errors",
		w.RPS, w.AvgUs, w.P50Us, w.P90Us, w.P99Us, w.Requests)
	if w.Requests > 0 {
		fmt.Fprintf(&b, "; per request: %.1f shortcut messages, %.1f bypassed packets, %.1f us CPU; busy per CPU %s %%",
			s.acc.redirected/w.Requests, s.acc.bypassed/w.Requests, cpuPerReq(s), busyCell([]sample{s}))
	}
	if len(s.acc.fallbacks) > 0 {
		reasons := make([]string, 0, len(s.acc.fallbacks))
		for r := range s.acc.fallbacks {
			reasons = append(reasons, r)
		}
		sort.Slice(reasons, func(i, j int) bool { return s.acc.fallbacks[reasons[i]] > s.acc.fallbacks[reasons[j]] })
		b.WriteString("; bypass fallbacks")
		for _, r := range reasons[:min(4, len(reasons))] {
			fmt.Fprintf(&b, " %s %.0f", r, s.acc.fallbacks[r])
		}
	}
	return b.String()
}

// metric is a column of wrk's output as a table row.
type metric struct {
	name string
	get  func(mesh.WrkResult) float64
}

var metrics = []metric{
	{"avg latency (us)", func(w mesh.WrkResult) float64 { return w.AvgUs }},
	{"p50 latency (us)", func(w mesh.WrkResult) float64 { return w.P50Us }},
	{"p90 latency (us)", func(w mesh.WrkResult) float64 { return w.P90Us }},
	{"p99 latency (us)", func(w mesh.WrkResult) float64 { return w.P99Us }},
	{"RPS", func(w mesh.WrkResult) float64 { return w.RPS }},
}

// table writes one routing mode's results as a Markdown table laid out as
// Yang et al.'s figures 8-9 (per concurrency: latency and QPS for each
// configuration): the median over rounds, and for the accelerated
// configurations the median of the per-round changes against the baseline
// of the same round.
func table(w io.Writer, r results, configs []string, concs []int) {
	header := append([]string{"c", "metric"}, configs...)
	var rows [][]string
	for _, c := range concs {
		for i, m := range metrics {
			row := []string{"", m.name}
			if i == 0 {
				row[0] = fmt.Sprint(c)
			}
			base := r[Baseline][c]
			for _, cfg := range configs {
				ss := r[cfg][c]
				cell := fmtValue(median(values(ss, m.get)))
				if cfg != Baseline {
					cell += " (" + change(base, ss, m.get) + ")"
				}
				row = append(row, cell)
			}
			rows = append(rows, row)
		}
		// CPU time per request, with its change like the metrics above.
		row := []string{"", "CPU per request (us, all CPUs)"}
		for _, cfg := range configs {
			cell := fmtValue(median(cpuValues(r[cfg][c])))
			if cfg != Baseline {
				cell += " (" + changeOf(r[Baseline][c], r[cfg][c], cpuPerReq) + ")"
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
		row = []string{"", "busy per CPU (%)"}
		for _, cfg := range configs {
			row = append(row, busyCell(r[cfg][c]))
		}
		rows = append(rows, row)
		for _, acc := range []struct {
			name string
			get  func(sample) float64
		}{
			{"shortcut messages / request", func(s sample) float64 { return s.acc.redirected / s.wrk.Requests }},
			{"bypassed packets / request", func(s sample) float64 { return s.acc.bypassed / s.wrk.Requests }},
		} {
			row := []string{"", acc.name}
			for _, cfg := range configs {
				var xs []float64
				for _, s := range r[cfg][c] {
					if s.wrk.Requests > 0 {
						xs = append(xs, acc.get(s))
					}
				}
				row = append(row, fmt.Sprintf("%.1f", median(xs)))
			}
			rows = append(rows, row)
		}
	}
	var b strings.Builder
	bench.WriteTable(&b, header, rows)
	io.WriteString(w, b.String())
}

func fmtValue(x float64) string {
	if x >= 100 {
		return fmt.Sprintf("%.0f", x)
	}
	return fmt.Sprintf("%.1f", x)
}

func values(ss []sample, get func(mesh.WrkResult) float64) []float64 {
	var xs []float64
	for _, s := range ss {
		xs = append(xs, get(s.wrk))
	}
	return xs
}

// cpuPerReq is the machine's busy CPU time per request of a wrk run, in
// microseconds.
func cpuPerReq(s sample) float64 {
	if s.wrk.Requests <= 0 {
		return 0
	}
	return s.cpu.seconds / s.wrk.Requests * 1e6
}

func cpuValues(ss []sample) []float64 {
	var xs []float64
	for _, s := range ss {
		xs = append(xs, cpuPerReq(s))
	}
	return xs
}

// busyCell is the median busy share of each CPU over the samples, as
// "cpu0/cpu1/...".
func busyCell(ss []sample) string {
	if len(ss) == 0 {
		return "-"
	}
	var parts []string
	for i := range ss[0].cpu.busy {
		var xs []float64
		for _, s := range ss {
			if i < len(s.cpu.busy) {
				xs = append(xs, s.cpu.busy[i]*100)
			}
		}
		parts = append(parts, fmt.Sprintf("%.0f", median(xs)))
	}
	return strings.Join(parts, "/")
}

// change is the median over rounds of (x / baseline - 1) in percent,
// pairing the samples of the same round, then (with several rounds) the
// smallest and largest of those changes.
func change(base, x []sample, get func(mesh.WrkResult) float64) string {
	return changeOf(base, x, func(s sample) float64 { return get(s.wrk) })
}

func changeOf(base, x []sample, get func(sample) float64) string {
	byRound := map[int]float64{}
	for _, s := range base {
		byRound[s.round] = get(s)
	}
	var ch []float64
	for _, s := range x {
		if b, ok := byRound[s.round]; ok && b > 0 {
			ch = append(ch, (get(s)/b-1)*100)
		}
	}
	if len(ch) == 0 {
		return "-"
	}
	if len(ch) == 1 {
		return fmt.Sprintf("%+.1f%%", ch[0])
	}
	return fmt.Sprintf("%+.1f%%, %+.0f..%+.0f", median(ch), slices.Min(ch), slices.Max(ch))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// rotate is configs rotated left by round (0-based): every configuration
// takes every place in the order once in len(configs) rounds.
func rotate(cfgs []string, round int) []string {
	out := slices.Clone(cfgs)
	for range round % len(out) {
		out = append(out[1:], out[0])
	}
	return out
}
