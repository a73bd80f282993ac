package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/bench/mesh"
	"github.com/eztunnel/eztunnel/lab/meshlab"
)

func benchLabCmd() *cobra.Command {
	o := mesh.DefaultOptions()
	var quick bool
	var report string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Service-mesh benchmark lab: ping-echo, file-transfer, redis and http in mesh modes none/sidecar/ambient, baseline vs eztunnel (needs root)",
		Long: `Builds a node from network namespaces, emulates a service mesh with real
HAProxy proxies (sidecar: one per pod with Istio's iptables capture; ambient:
one shared node proxy; -tls: TLS between the proxies) and runs every workload
in --reps rounds of four runs: an A/A pair (baseline twice) and an A/B pair
(baseline, eztunnel), in an order that cycles over four rounds. Prints per
metric the median of the per-round paired differences with its 95%
bootstrap interval, and the A/A's: a target is judged on the interval's far
end, and only when its A/A holds 0 within ±2%. With --b2b-pairs (--quick)
the back-to-back ping-echo is paired instead: one datapath, and phases on
fresh connections alternating between a port it excludes (A, the kernel
path) and one it takes (B), through the same proxies and hops; every
phase's counters must show B accelerated and A not. Writes raw results,
summary.md, runs.csv and plots to --out and prints the main table.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if report != "" {
				rep, err := mesh.RenderReport(report)
				if err != nil {
					return err
				}
				return rep.WriteMain(os.Stdout)
			}
			if quick {
				// Quick settings, then whatever the user set explicitly wins.
				q := o
				q.ApplyQuick()
				f := cmd.Flags()
				for name, apply := range map[string]func(){
					"reps":          func() { q.Reps = o.Reps },
					"paced-n":       func() { q.PacedN = o.PacedN },
					"ping-n":        func() { q.PingN = o.PingN },
					"transfer-mib":  func() { q.TransferMiB = o.TransferMiB },
					"redis-n":       func() { q.RedisN = o.RedisN },
					"http-duration": func() { q.HTTPDuration = o.HTTPDuration },
					"workload":      func() { q.Workloads = o.Workloads },
					"cpu":           func() { q.CPUs = o.CPUs },
					"nice":          func() { q.Nice = o.Nice },
					"ping-conns":    func() { q.PingConns = o.PingConns },
					"b2b-pairs":     func() { q.PairQuads = o.PairQuads },
					"b2b-phase":     func() { q.PairPhase = o.PairPhase },
					"b2b-conns":     func() { q.PairConns = o.PairConns },
				} {
					if f.Changed(name) {
						apply()
					}
				}
				o = q
			}
			if o.Out == "" {
				o.Out = filepath.Join("results", "lab-"+time.Now().Format("20060102-150405"))
			}
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				return mesh.Bench(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, fmt.Sprintf("short run that repeats: back-to-back ping-echo paired (%d quads of 100 ms phases, 16 fresh connections each), 6 rounds of four short file-transfer and redis runs (latency, FCT; no throughput), pinned to one CPU at nice -10; under a minute per mesh mode", mesh.QuickPairQuads))
	f.StringVar(&report, "report", "", "render summary.md, runs.csv and plots again from a results directory and exit")
	f.StringSliceVar(&o.Meshes, "mesh", o.Meshes, fmt.Sprintf("mesh modes, in order (%v)", meshlab.Meshes))
	f.StringSliceVar(&o.Workloads, "workload", o.Workloads, fmt.Sprintf("workloads (%v)", mesh.Workloads))
	f.IntVar(&o.Reps, "reps", o.Reps, "rounds of four runs of every workload: an A/A pair of baseline runs and an A/B pair (baseline, eztunnel); intervals need at least 2")
	f.IntVar(&o.PacedN, "paced-n", o.PacedN, "paced ping-echo messages per run")
	f.DurationVar(&o.Interval, "interval", o.Interval, "interval of the paced ping-echo")
	f.IntVar(&o.PingN, "ping-n", o.PingN, "back-to-back ping-echo messages per connection")
	f.IntVar(&o.PingConns, "ping-conns", o.PingConns, "back-to-back ping-echo connections per run, one after the other (--quick: 20)")
	f.IntVar(&o.PairQuads, "b2b-pairs", o.PairQuads, "paired back-to-back ping-echo: quads of phases (an A/A pair, an A/B pair) per mesh, each phase on fresh connections, A to a port the datapath excludes (the kernel path), B to the echo port (the shortcut), through the same proxies; 0: none (--quick: "+strconv.Itoa(mesh.QuickPairQuads)+")")
	f.DurationVar(&o.PairPhase, "b2b-phase", o.PairPhase, "length of a paired ping-echo phase")
	f.IntVar(&o.PairConns, "b2b-conns", o.PairConns, "fresh connections per paired ping-echo phase, used in turn")
	f.StringVar(&o.PairDatapath, "b2b-datapath", o.PairDatapath, fmt.Sprintf("what the paired ping-echo's B phases take (%v): eztunnel, or the lab's naive sockmap (the peers' model, no invariants: a bound on what a socket redirect gains on the same chain); the rounds always take eztunnel", mesh.PairDatapaths))
	f.IntVar(&o.Nice, "nice", 0, "niceness of every lab process (--quick: -10)")
	f.IntVar(&o.TransferMiB, "transfer-mib", o.TransferMiB, "file-transfer size in MiB (one connection)")
	f.IntVar(&o.RedisN, "redis-n", o.RedisN, "redis-benchmark requests per test (SET and GET)")
	f.IntVar(&o.RedisClients, "redis-clients", o.RedisClients, "redis-benchmark parallel clients")
	f.DurationVar(&o.HTTPDuration, "http-duration", o.HTTPDuration, "wrk duration per run")
	f.IntVar(&o.HTTPConns, "http-conns", o.HTTPConns, "wrk connections")
	f.StringVar(&o.CPUs, "cpu", "", "pin every lab process to these CPUs (list, e.g. 0 or 0-1; sched_setaffinity); default unpinned, --quick: the last CPU")
	f.StringVar(&o.Out, "out", "", "results directory (default results/lab-<timestamp>)")
	f.StringVar(&o.LabName, "lab-name", o.LabName, "netlab name of the node (tests run labs side by side)")
	f.IntVar(&o.Subnet, "subnet", o.Subnet, "netlab subnet of the node: 10.77.<subnet>.0/24")
	f.StringVar(&o.PinRoot, "pin-path", o.PinRoot, "bpffs directory the lab's datapath is pinned under")
	for _, h := range []string{"lab-name", "subnet", "pin-path"} {
		f.MarkHidden(h)
	}
	return cmd
}
