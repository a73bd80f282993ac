package services

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
)

func f1(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return strconv.FormatFloat(x, 'f', 1, 64)
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "–"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

// step finds the (count, datapath) step.
func step(res Result, count int, dp string) *Step {
	for i := range res.Steps {
		if res.Steps[i].Count == count && res.Steps[i].Datapath == dp {
			return &res.Steps[i]
		}
	}
	return nil
}

func counts(res Result) []int {
	seen := map[int]bool{}
	var cs []int
	for _, s := range res.Steps {
		if !seen[s.Count] {
			seen[s.Count] = true
			cs = append(cs, s.Count)
		}
	}
	sort.Ints(cs)
	return cs
}

func summ(s *Step, path string) stats.Summary {
	if s == nil || len(s.Latency[path]) == 0 {
		return stats.Summary{P50: math.NaN(), P99: math.NaN(), Max: math.NaN(), StdDev: math.NaN()}
	}
	return stats.Summarize(s.Latency[path])
}

// report writes the paper's Tables II/III layout (max and SD ratios per
// Service count) for connect latency on each path, eztunnel over iptables
// and over nftables, with the absolute values beside them; then sync times.
func report(w io.Writer, res Result, dps []string) {
	var b strings.Builder
	for _, path := range []string{"clusterip-v4", "clusterip-v6", "nodeport-v4", "nodeport-v6"} {
		fmt.Fprintf(&b, "\n### Connect latency, %s (µs; a new TCP connection to a random Service each time)\n\n", path)
		header := []string{"Services", "max ez/ipt", "SD ez/ipt", "max ez/nft", "SD ez/nft"}
		for _, dp := range dps {
			header = append(header, dp+" p50", dp+" p99", dp+" max", dp+" SD", dp+" fail")
		}
		var rows [][]string
		for _, c := range counts(res) {
			ez, ipt, nft := summ(step(res, c, Eztunnel), path), summ(step(res, c, IPTables), path), summ(step(res, c, NFTables), path)
			row := []string{strconv.Itoa(c), ratio(ez.Max, ipt.Max), ratio(ez.StdDev, ipt.StdDev), ratio(ez.Max, nft.Max), ratio(ez.StdDev, nft.StdDev)}
			for _, dp := range dps {
				s := step(res, c, dp)
				x := summ(s, path)
				fails := "–"
				if s != nil && s.Latency[path] != nil {
					fails = strconv.Itoa(s.Fails[path])
				}
				row = append(row, f1(x.P50), f1(x.P99), f1(x.Max), f1(x.StdDev), fails)
			}
			rows = append(rows, row)
		}
		bench.WriteTable(&b, header, rows)
	}
	fmt.Fprintf(&b, "\n### One-change sync (ms): API write to the first connect through the new port; the datapath's own histogram p50/p99\n\n")
	header := []string{"Services"}
	for _, dp := range dps {
		header = append(header, dp+" e2e p50", dp+" e2e p99", dp+" e2e max")
		for _, m := range syncMetrics[dp] {
			short := strings.TrimPrefix(strings.TrimPrefix(m, "kubeproxy_"), "eztunnel_services_")
			header = append(header, dp+" "+short+" p50/p99")
		}
	}
	var rows [][]string
	for _, c := range counts(res) {
		row := []string{strconv.Itoa(c)}
		for _, dp := range dps {
			s := step(res, c, dp)
			if s == nil {
				row = append(row, "–", "–", "–")
				for range syncMetrics[dp] {
					row = append(row, "–")
				}
				continue
			}
			x := stats.Summarize(s.SyncE2E)
			row = append(row, f1(x.P50), f1(x.P99), f1(x.Max))
			for _, m := range syncMetrics[dp] {
				q := s.SyncMetric[m]
				row = append(row, f1(q[0])+" / "+f1(q[1]))
			}
		}
		rows = append(rows, row)
	}
	bench.WriteTable(&b, header, rows)
	fmt.Fprintf(&b, "\nCreating Services (each with an IPv4 and an IPv6 EndpointSlice, %d parallel writers):", createWorkers)
	for _, c := range counts(res) {
		fmt.Fprintf(&b, " up to %d in %.1f s;", c, res.CreateTimes[c])
	}
	fmt.Fprintf(&b, "\nDatapath ready (start until the first and newest Service answer, s):")
	for _, c := range counts(res) {
		for _, dp := range dps {
			if s := step(res, c, dp); s != nil {
				fmt.Fprintf(&b, " %s@%d %.1f;", dp, c, s.Ready)
			}
		}
	}
	fmt.Fprintf(&b, "\nCPU placement: %s\n", res.CPUPlacement)
	io.WriteString(w, b.String())
}

// plots: connect latency p50 and p99 against the Service count, per path.
func plots(res Result, dir string) error {
	for _, path := range []string{"clusterip-v4", "clusterip-v6", "nodeport-v4", "nodeport-v6"} {
		pl := plot.New()
		pl.Title.Text = "Connect latency, " + path
		pl.X.Label.Text = "Services"
		pl.Y.Label.Text = "µs"
		pl.Add(plotter.NewGrid())
		any := false
		for di, dp := range []string{IPTables, NFTables, Eztunnel} {
			for qi, q := range []struct {
				name string
				f    func(stats.Summary) float64
			}{{"p50", func(s stats.Summary) float64 { return s.P50 }}, {"p99", func(s stats.Summary) float64 { return s.P99 }}} {
				var xy plotter.XYs
				for _, c := range counts(res) {
					s := step(res, c, dp)
					if s == nil || len(s.Latency[path]) == 0 {
						continue
					}
					xy = append(xy, plotter.XY{X: float64(c), Y: q.f(stats.Summarize(s.Latency[path]))})
				}
				if len(xy) == 0 {
					continue
				}
				l, p, err := plotter.NewLinePoints(xy)
				if err != nil {
					return err
				}
				l.Color, p.Color = plotutil.Color(di), plotutil.Color(di)
				l.Dashes = plotutil.Dashes(qi)
				pl.Add(l, p)
				pl.Legend.Add(dp+" "+q.name, l, p)
				any = true
			}
		}
		if !any {
			continue
		}
		if err := pl.Save(16*vg.Centimeter, 10*vg.Centimeter, filepath.Join(dir, "connect-"+path+".png")); err != nil {
			return err
		}
	}
	return nil
}
