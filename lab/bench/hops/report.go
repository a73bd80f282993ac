package hops

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/naivesockmap"
)

// Summary of one mesh's runs.
type Summary struct {
	Mesh   string
	Rounds int
	P50    map[string]float64 // median over rounds of each run's p50, µs
	// Progs: per datapath, per program, its statistics summed over rounds,
	// and the round trips they ran for.
	Progs      map[string]map[string]bench.ProgStat
	RoundTrips map[string]int
	Redirected map[string]float64 // messages redirected per round trip (both runs of a round)
}

// Summarize groups runs by mesh, in the order they ran.
func Summarize(res Result) []Summary {
	var out []Summary
	idx := map[string]int{}
	p50s := map[string]map[string][]float64{}
	for _, r := range res.Runs {
		i, ok := idx[r.Mesh]
		if !ok {
			i, idx[r.Mesh] = len(out), len(out)
			out = append(out, Summary{Mesh: r.Mesh, P50: map[string]float64{}, Progs: map[string]map[string]bench.ProgStat{},
				RoundTrips: map[string]int{}, Redirected: map[string]float64{}})
			p50s[r.Mesh] = map[string][]float64{}
		}
		s := &out[i]
		s.Rounds = max(s.Rounds, r.Round)
		p50s[r.Mesh][r.Datapath] = append(p50s[r.Mesh][r.Datapath], r.P50)
		if s.Progs[r.Datapath] == nil {
			s.Progs[r.Datapath] = map[string]bench.ProgStat{}
		}
		for name, st := range r.Progs {
			s.Progs[r.Datapath][name] = s.Progs[r.Datapath][name].Add(st)
		}
		s.RoundTrips[r.Datapath] += r.RoundTrips
		s.Redirected[r.Datapath] += float64(Redirected(r)) / float64(2*r.RoundTrips)
	}
	for i := range out {
		s := &out[i]
		for dp, xs := range p50s[s.Mesh] {
			slices.Sort(xs)
			s.P50[dp] = stats.Quantile(xs, 0.5)
			s.Redirected[dp] /= float64(len(xs))
		}
	}
	return out
}

// Redirected is how many messages the run's datapath redirected (its
// timed and its statistics run).
func Redirected(r Run) uint64 {
	switch r.Datapath {
	case Naive:
		return naivesockmap.Redirected(r.Counters)
	case Eztunnel:
		return r.Counters["messages_redirected"]
	}
	return 0
}

// perRT is a program's runs and time per round trip.
func perRT(st bench.ProgStat, rts int) (runs, ns float64) {
	if rts == 0 {
		return math.NaN(), math.NaN()
	}
	return float64(st.Runs) / float64(rts), float64(st.Runtime.Nanoseconds()) / float64(rts)
}

// Report renders every mesh's tables.
func Report(res Result) string {
	var b strings.Builder
	for _, s := range Summarize(res) {
		writeMesh(&b, s)
	}
	return b.String()
}

func writeMesh(b *strings.Builder, s Summary) {
	fmt.Fprintf(b, "\n## mesh %s: 24 B ping-echo back to back, one CPU, %d round(s)\n\n", s.Mesh, s.Rounds)
	var rows [][]string
	for _, dp := range Datapaths {
		rows = append(rows, []string{dp, bench.Num(s.P50[dp], 1), bench.WithUnit(100*(bench.Ratio(s.P50[dp], s.P50[Plain])-1), "%"),
			bench.Num(s.Redirected[dp], 2)})
	}
	bench.WriteTable(b, []string{"datapath", "p50 µs", "vs plain", "redirected msgs / round trip"}, rows)
	b.WriteString("\nPrograms (BPF run-time statistics, a run of their own):\n\n")
	rows = nil
	for _, dp := range []string{Naive, Eztunnel} {
		for _, name := range sortedNames(s.Progs[dp]) {
			st := s.Progs[dp][name]
			runs, ns := perRT(st, s.RoundTrips[dp])
			rows = append(rows, []string{dp, name, bench.Num(runs, 2), bench.Num(st.NsPerRun(), 0), bench.Num(ns, 0)})
		}
	}
	bench.WriteTable(b, []string{"datapath", "program", "runs / round trip", "ns / run", "ns / round trip"}, rows)
	gap := (s.P50[Eztunnel] - s.P50[Naive]) * 1000
	fmt.Fprintf(b, "\nGap eztunnel - naive: %.1f µs per round trip (p50s), split:\n\n", gap/1000)
	rows = nil
	var inProgs float64
	add := func(label string, ns float64) {
		inProgs += ns
		rows = append(rows, []string{label, bench.Num(ns, 0), bench.WithUnit(100*ns/gap, "%")})
	}
	for _, name := range sortedNames(s.Progs[Eztunnel]) {
		_, ns := perRT(s.Progs[Eztunnel][name], s.RoundTrips[Eztunnel])
		add(name, ns)
	}
	for _, name := range sortedNames(s.Progs[Naive]) {
		_, ns := perRT(s.Progs[Naive][name], s.RoundTrips[Naive])
		add("minus "+name, -ns)
	}
	rest := gap - inProgs
	rows = append(rows, []string{"not in program time", bench.Num(rest, 0), bench.WithUnit(100*rest/gap, "%")})
	bench.WriteTable(b, []string{"part", "ns / round trip", "share of gap"}, rows)
}

// sortedNames are the programs that ran, most time first.
func sortedNames(m map[string]bench.ProgStat) []string {
	var names []string
	for n, st := range m {
		if st.Runs > 0 {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(i, j int) bool {
		if m[names[i]].Runtime != m[names[j]].Runtime {
			return m[names[i]].Runtime > m[names[j]].Runtime
		}
		return names[i] < names[j]
	})
	return names
}
