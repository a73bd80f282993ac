package services

import (
	"fmt"
	"io"
	"maps"
	"math"
	"path/filepath"
	"slices"
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
	ditgReport(&b, res, dps)
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
	if s := step(res, counts(res)[0], Eztunnel); s != nil && len(s.NodePortProg) > 0 {
		fmt.Fprintf(&b, "\neztunnel's tc NodePort program over the NodePort connect probes (ns per run, runs; BPF run-time statistics):")
		for _, c := range counts(res) {
			if s := step(res, c, Eztunnel); s != nil {
				for _, path := range slices.Sorted(maps.Keys(s.NodePortProg)) {
					fmt.Fprintf(&b, " %s@%d %.0f (%.0f);", path, c, s.NodePortProg[path][0], s.NodePortProg[path][1])
				}
			}
		}
	}
	fmt.Fprintf(&b, "\nCPU placement: %s", res.CPUPlacement)
	if len(res.Load) > 0 {
		fmt.Fprintf(&b, "\nLoad average (/proc/loadavg) as each count started: %s", strings.Join(res.Load, "; "))
	}
	fmt.Fprintln(&b)
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

func meanOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return stats.Summarize(xs).Mean
}

func p50Of(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return stats.Summarize(xs).P50
}

// D-ITG metrics: TCP throughput and UDP one-way delay.
const (
	MetricThroughput = "throughput"
	MetricUDPDelay   = "udp-delay"
)

func ditgSamples(s *Step, metric, path string) []float64 {
	if s == nil {
		return nil
	}
	if metric == MetricThroughput {
		return s.Throughput[path]
	}
	return s.UDPDelay[path]
}

func ditgSumm(s *Step, metric, path string) stats.Summary {
	xs := ditgSamples(s, metric, path)
	if len(xs) == 0 {
		return stats.Summary{P50: math.NaN(), P99: math.NaN(), Max: math.NaN(), StdDev: math.NaN(), Mean: math.NaN()}
	}
	return stats.Summarize(xs)
}

// lossPct: UDP packets the receiver did not get, over the flows of path.
func lossPct(s *Step, path string) float64 {
	var got, lost float64
	for _, f := range s.Flows {
		if f.Path == path && f.Proto == "UDP" {
			got += float64(f.Dec.Packets)
			lost += float64(f.Dec.Dropped)
		}
	}
	if got+lost == 0 {
		return math.NaN()
	}
	return 100 * lost / (got + lost)
}

// ditgTable is the paper's Tables I-III layout for one D-ITG metric and
// path: per Service count the SD and max ratios eztunnel / iptables and
// eztunnel / nftables, then each datapath's mean, p50, SD and max (UDP
// delay also p99 and loss).
func ditgTable(res Result, dps []string, metric, path string) (header []string, rows [][]string) {
	header = []string{"Services", "SD ez/ipt", "max ez/ipt", "SD ez/nft", "max ez/nft"}
	for _, dp := range dps {
		header = append(header, dp+" mean", dp+" p50", dp+" SD", dp+" max")
		if metric == MetricUDPDelay {
			header = append(header, dp+" p99", dp+" loss %")
		}
		header = append(header, dp+" retried")
	}
	for _, c := range counts(res) {
		ez := ditgSumm(step(res, c, Eztunnel), metric, path)
		ipt := ditgSumm(step(res, c, IPTables), metric, path)
		nft := ditgSumm(step(res, c, NFTables), metric, path)
		row := []string{strconv.Itoa(c), ratio(ez.StdDev, ipt.StdDev), ratio(ez.Max, ipt.Max), ratio(ez.StdDev, nft.StdDev), ratio(ez.Max, nft.Max)}
		for _, dp := range dps {
			s := step(res, c, dp)
			x := ditgSumm(s, metric, path)
			row = append(row, f1(x.Mean), f1(x.P50), f1(x.StdDev), f1(x.Max))
			if metric == MetricUDPDelay {
				loss := math.NaN()
				if s != nil {
					loss = lossPct(s, path)
				}
				row = append(row, f1(x.P99), f2(loss))
			}
			retried := "–"
			if s != nil && len(ditgSamples(s, metric, path)) > 0 {
				proto := "TCP"
				if metric == MetricUDPDelay {
					proto = "UDP"
				}
				retried = strconv.Itoa(s.DITGFails[path+"/"+proto])
			}
			row = append(row, retried)
		}
		rows = append(rows, row)
	}
	return header, rows
}

func f2(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// ditgReport writes the D-ITG tables (none if the run had no D-ITG flows).
func ditgReport(b *strings.Builder, res Result, dps []string) {
	if res.DITG.N == 0 {
		return
	}
	d := res.DITG
	for _, m := range []struct{ metric, title string }{
		{MetricThroughput, fmt.Sprintf("TCP throughput (Mbit/s per %v interval of %d flows × %v; D-ITG %d B × %d pkt/s offered)",
			d.Interval, d.N, d.Duration, d.TCPSize, d.TCPRate)},
		{MetricUDPDelay, fmt.Sprintf("UDP one-way delay (µs, every packet of %d flows × %v; D-ITG %d B × %d pkt/s)",
			d.N, d.Duration, d.UDPSize, d.UDPRate)},
	} {
		for _, path := range DITGPaths {
			fmt.Fprintf(b, "\n### D-ITG %s, %s\n\n", m.title, path)
			h, rows := ditgTable(res, dps, m.metric, path)
			bench.WriteTable(b, h, rows)
		}
	}
	fmt.Fprintf(b, "\n### D-ITG UDP one-way delay of each flow's first packet (µs, mean over the %d flows; the packet that meets the Service lookup)\n\n", d.N)
	h, rows := firstPacketTable(res, dps)
	bench.WriteTable(b, h, rows)
}

// ditgPlots: TCP throughput (mean) and UDP delay (p50, p99) against the
// Service count, one file per metric and path.
func ditgPlots(res Result, dir string) error {
	for _, m := range []struct {
		metric, title, unit string
		qs                  []string
	}{{MetricThroughput, "D-ITG TCP throughput", "Mbit/s", []string{"mean", "p50"}}, {MetricUDPDelay, "D-ITG UDP one-way delay", "µs", []string{"p50", "p99"}}} {
		for _, path := range DITGPaths {
			pl := plot.New()
			pl.Title.Text = m.title + ", " + path
			pl.X.Label.Text = "Services"
			pl.Y.Label.Text = m.unit
			pl.Add(plotter.NewGrid())
			any := false
			for di, dp := range []string{IPTables, NFTables, Eztunnel} {
				for qi, q := range m.qs {
					var xy plotter.XYs
					for _, c := range counts(res) {
						s := step(res, c, dp)
						if len(ditgSamples(s, m.metric, path)) == 0 {
							continue
						}
						x := ditgSumm(s, m.metric, path)
						y := x.P50
						switch q {
						case "mean":
							y = x.Mean
						case "p99":
							y = x.P99
						}
						xy = append(xy, plotter.XY{X: float64(c), Y: y})
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
					pl.Legend.Add(dp+" "+q, l, p)
					any = true
				}
			}
			if !any {
				continue
			}
			// From zero, the legend above the lines: the differences are
			// small and a zoomed axis would make noise look like a trend.
			pl.Y.Min, pl.Y.Max = 0, pl.Y.Max*1.5
			pl.Legend.Top, pl.Legend.Left = true, true
			if err := pl.Save(16*vg.Centimeter, 10*vg.Centimeter, filepath.Join(dir, "ditg-"+m.metric+"-"+path+".png")); err != nil {
				return err
			}
		}
	}
	return nil
}

// firstPackets: the one-way delay of each UDP flow's first packet on path
// (the packet that meets the Service lookup: kube-proxy's rule walk or
// eztunnel's map lookup; the rest follow conntrack or the translated
// socket). UDPDelay holds the flows' packets in flow order; nil if the
// counts do not add up.
func firstPackets(s *Step, path string) []float64 {
	if s == nil {
		return nil
	}
	d := s.UDPDelay[path]
	var out []float64
	i := 0
	for _, f := range s.Flows {
		if f.Path != path || f.Proto != "UDP" {
			continue
		}
		if i >= len(d) || f.Dec.Packets <= 0 {
			return nil
		}
		out = append(out, d[i])
		i += f.Dec.Packets
	}
	if i != len(d) {
		return nil
	}
	return out
}

// firstPacketTable: per count, each path's and datapath's mean first-packet
// delay over the flows.
func firstPacketTable(res Result, dps []string) (header []string, rows [][]string) {
	header = []string{"Services"}
	for _, path := range DITGPaths {
		for _, dp := range dps {
			header = append(header, path+" "+dp)
		}
	}
	for _, c := range counts(res) {
		row := []string{strconv.Itoa(c)}
		for _, path := range DITGPaths {
			for _, dp := range dps {
				row = append(row, f1(meanOf(firstPackets(step(res, c, dp), path))))
			}
		}
		rows = append(rows, row)
	}
	return header, rows
}
