package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/bench/adoption"
	"github.com/eztunnel/eztunnel/lab/bench/bypass"
	"github.com/eztunnel/eztunnel/lab/bench/meshmatrix"
	"github.com/eztunnel/eztunnel/lab/bench/quick"
	"github.com/eztunnel/eztunnel/lab/bench/scale"
	"github.com/eztunnel/eztunnel/lab/bench/scope"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Compare plain kernel TCP with the datapath on a throwaway lab node"}
	cmd.AddCommand(benchQuickCmd(), benchMemoryCmd(), benchLabCmd(), benchEarlyDataCmd(), benchScopeCmd(), benchAdoptCmd(), benchBypassCmd(), benchPoolCmd(), benchMeshMatrixCmd(), benchServicesCmd(), benchTracePathsCmd(), benchScaleCmd(), benchHopsCmd())
	return cmd
}

func benchQuickCmd() *cobra.Command {
	o := quick.DefaultOptions()
	cmd := &cobra.Command{
		Use:   "quick",
		Short: "Baseline vs accelerated RTT and transfer time between two pods: paired phases with 95% intervals and an A/A check (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				return quick.Quick(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of four phases on fresh connections: an A/A pair (baseline twice) and an A/B pair (baseline, accelerated), order alternating; intervals need at least 2")
	f.IntVar(&o.RTTN, "rtt-n", o.RTTN, "recorded 24 B round trips per phase (64 KiB: a tenth)")
	f.Uint64Var(&o.TransferBytes, "transfer-bytes", o.TransferBytes, "bytes of each phase's flow-completion-time transfer")
	f.IntVar(&o.CPU, "cpu", o.CPU, "CPU that client and server are pinned to (-1: no pinning)")
	f.Uint32Var(&o.MaxUnread, "max-unread", 0, "the datapath's unread bound in bytes (eztunnel run --max-unread); 0: its default")
	f.StringVar(&o.Out, "out", "", "directory to write quick.json with every round's results")
	return cmd
}

func benchMemoryCmd() *cobra.Command {
	o := quick.MemoryOptions{Conns: 10000}
	cmd := &cobra.Command{
		Use:   "memory",
		Short: "Agent RSS and BPF map memory, idle and with established accelerated connections (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				if o.Agent == "" {
					o.Agent = filepath.Join(filepath.Dir(exe), "eztunnel")
				}
				return quick.Memory(ctx, o, os.Stdout)
			})
		},
	}
	cmd.Flags().IntVar(&o.Conns, "conns", o.Conns, "established connections to hold")
	cmd.Flags().StringVar(&o.Agent, "agent", "", "the eztunnel agent binary (default: eztunnel next to this binary)")
	return cmd
}

func benchEarlyDataCmd() *cobra.Command {
	o := quick.EarlyDataOptions{Conns: 1000}
	cmd := &cobra.Command{
		Use:   "early-data",
		Short: "How often a client writing right after connect() settles for the kernel path: pinned, unpinned, under a CPU hog (needs root, stress-ng)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				return quick.EarlyData(ctx, o, os.Stdout)
			})
		},
	}
	cmd.Flags().IntVar(&o.Conns, "conns", o.Conns, "connections per placement, one after the other")
	return cmd
}

func benchAdoptCmd() *cobra.Command {
	o := adoption.Options{Rounds: 5, Conns: 8, N: 2000, Mesh: "none"}
	cmd := &cobra.Command{
		Use:   "adopt",
		Short: "RTT of connections opened before the agent: before adoption, after it, and of pairs made at handshake (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				return adoption.Run(ctx, o, os.Stdout)
			})
		},
	}
	cmd.Flags().IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds")
	cmd.Flags().IntVar(&o.Conns, "conns", o.Conns, "connections per pool")
	cmd.Flags().IntVar(&o.N, "n", o.N, "round trips per connection and phase")
	cmd.Flags().StringVar(&o.Mesh, "mesh", o.Mesh, "none, sidecar or ambient (HAProxy proxies; their legs are adopted too)")
	return cmd
}

func benchScopeCmd() *cobra.Command {
	o := scope.Options{Pods: 500, Rounds: 5, Log: os.Stderr}
	cmd := &cobra.Command{
		Use:   "scope",
		Short: "Cost of selecting pods: a link pair per pod cgroup vs one attachment and a map entry per pod (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return scope.Run(o, os.Stdout)
		},
	}
	cmd.Flags().IntVar(&o.Pods, "pods", o.Pods, "pod cgroups to select")
	cmd.Flags().IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of each measurement")
	return cmd
}

// parseModes parses --modes of the multi-node benchmarks.
func parseModes(modes []string) ([]multinode.Mode, error) {
	var out []multinode.Mode
	for _, m := range modes {
		switch multinode.Mode(m) {
		case multinode.HostGW, multinode.VXLAN:
			out = append(out, multinode.Mode(m))
		default:
			return nil, fmt.Errorf("--modes: %q is not %q or %q", m, multinode.HostGW, multinode.VXLAN)
		}
	}
	return out, nil
}

func benchBypassCmd() *cobra.Command {
	o := bypass.Options{Rounds: 3, RTTN: 5000, Seconds: 3, ClientCPU: 1, ServerCPU: 1}
	modes := []string{string(multinode.HostGW), string(multinode.VXLAN)}
	dps := []string{"bridge", "bypass", "shortcut"}
	cmd := &cobra.Command{
		Use:   "bypass",
		Short: "The bridge bypass in the multi-node lab: bridge vs tc bypass vs bypass + shortcut, same-node and cross-node, TCP and UDP (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Modes, err = parseModes(modes); err != nil {
				return err
			}
			if o.Datapaths, err = bypass.ParseDatapaths(dps); err != nil {
				return fmt.Errorf("--datapaths: %w", err)
			}
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Lab, o.Agent = exe, filepath.Join(filepath.Dir(exe), "eztunnel")
				return bypass.Run(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&modes, "modes", modes, "routing modes: host-gw, vxlan")
	f.StringSliceVar(&dps, "datapaths", dps, "datapaths compared with the bridge (which always runs): bypass, shortcut (bypass+shortcut), idle (an agent that accelerates nothing), idle-psock (the same with the read tracepoint refused: reads counted by fexit where allowed, else gauged), idle-refuse:PROG+PROG... (idle with these programs refused as a kernel would refuse them: what each hook costs)")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds of the datapaths")
	f.IntVar(&o.RTTN, "rtt-n", o.RTTN, "round trips per RTT measurement")
	f.IntVar(&o.Seconds, "seconds", o.Seconds, "length of each iperf3 test")
	f.BoolVar(&o.IPv6, "ipv6", false, "pods talk IPv6")
	f.IntVar(&o.ClientCPU, "client-cpu", o.ClientCPU, "CPU of every client (-1: any)")
	f.IntVar(&o.ServerCPU, "server-cpu", o.ServerCPU, "CPU of every server (-1: any)")
	f.IntVar(&o.Pairs, "pairs", 0, "paired mode instead of rounds: the bypass against its own kernel path (paused, programs attached) on the same flows, this many quads of phases (an A/A pair and an A/B pair each), TCP and UDP round trips, with 95% bootstrap intervals (at least 20; 200 for the A/A row to resolve 2%)")
	f.DurationVar(&o.Phase, "phase", 100*time.Millisecond, "with --pairs: the length of each phase")
	f.IntVar(&o.Blocks, "blocks", 0, "with --pairs: run each row's quads in this many blocks, the rows' blocks interleaved over the run and each on fresh flows, and resample whole blocks for the interval, so it holds the spread between flows and over the run's minutes (must divide --pairs into blocks of at least 4 quads; 0: --pairs/20, at least 1)")
	f.StringVar(&o.Raw, "raw", "", "with --pairs: also write every phase's value to this file as CSV (pair, setup, mode, path, metric, block, quad, side, value; setup is the pods' address family, the phase, and --tc-hooks-on and --switch-links where given: bench pool pools only runs of one setup; side A is the kernel path or no agent, B and AA1, AA2 the bypass or the idle agent), from which the report's intervals can be recomputed and runs pooled (bench pool)")
	f.StringVar(&o.Pair, "pair", bypass.PairBypass, "with --pairs: what is paired: bypass (the bypass against its kernel path), idle (an agent that accelerates nothing against no agent: both nodes' agents' links detached and attached again in place) idle-narrow (idle with the hooks that run for the whole node here refused, the read tracepoint and the splice guard's syscall hooks: what the idle agent costs where the host allows fentry and fexit) or idle-unselected (idle-narrow for pods the agent does not select: it selects another pod of each node, as Kubernetes mode does, with --close-reset-devices=covered)")
	f.StringSliceVar(&o.Paths, "paths", nil, "with --pairs --pair idle, idle-narrow or idle-unselected: the paths measured, same-node and/or cross-node (default both)")
	f.BoolVar(&o.TCHooksOn, "tc-hooks-on", false, "with --pairs --pair idle, idle-narrow or idle-unselected: a clsact qdisc without filters on each node's loopback for the whole run, so the kernel's tc hook checks on every packet are on in A too, as on a node whose CNI has tc programs (what the agent's tcx links add there)")
	f.StringVar(&o.SwitchLinks, "switch-links", "", "with --pairs --pair idle, idle-narrow or idle-unselected: detach in A only the links whose name matches this regular expression (links/tcx/<netns>/<device>/<program>_<direction>, or the pin); the others stay attached on both sides (what one link costs)")
	return cmd
}

func benchPoolCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pool RAW RAW...",
		Short: "Pool runs of bench bypass --pairs from their --raw files: each run's interval, whether they agree, the spread between runs, and the interval that holds across them, with the targets judged on it (the bypass's RTT and stream targets, or the idle agent's at most +2%)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(_ *cobra.Command, files []string) error {
			return bypass.PoolRaw(files, os.Stdout)
		},
	}
}

func benchMeshMatrixCmd() *cobra.Command {
	o := meshmatrix.Options{Rounds: 4, Duration: 5 * time.Second, Concs: []int{1, 10, 100}, Threads: 1,
		ClientCPU: 0, ChainCPU: 1, Probes: 3}
	modes := []string{string(multinode.HostGW), string(multinode.VXLAN)}
	var quickRun bool
	cfgNames := []string{"baseline", "shortcut", "bypass", "both"}
	cmd := &cobra.Command{
		Use:   "mesh-matrix",
		Short: "Yang et al.'s matrix across two nodes: an HTTP chain of sidecar pods under wrk, baseline vs shortcut only vs bypass only vs both (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Modes, err = parseModes(modes); err != nil {
				return err
			}
			cfgs, err := meshmatrix.ParseConfigs(cfgNames)
			if err != nil {
				return fmt.Errorf("--configs: %w", err)
			}
			o.Configs = cfgs
			if quickRun {
				f := cmd.Flags()
				if !f.Changed("rounds") {
					o.Rounds = 2
				}
				if !f.Changed("duration") {
					o.Duration = 2 * time.Second
				}
			}
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Agent, o.Lab = filepath.Join(filepath.Dir(exe), "eztunnel"), exe
				return meshmatrix.Run(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&modes, "modes", modes, "routing modes: host-gw, vxlan")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds of the four configurations (the order rotates each round)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "each wrk run (whole seconds)")
	f.IntSliceVar(&o.Concs, "concurrency", o.Concs, "wrk connections, one run each per configuration and round")
	f.IntVar(&o.Threads, "threads", o.Threads, "wrk threads (at most the concurrency)")
	f.IntVar(&o.ClientCPU, "client-cpu", o.ClientCPU, "CPU of wrk (-1: any)")
	f.IntVar(&o.ChainCPU, "chain-cpu", o.ChainCPU, "CPU of every proxy and nginx of the chain (-1: any)")
	f.IntVar(&o.Probes, "probes", o.Probes, "integrity probes (curl, bodies checked) per page before and after each configuration's runs")
	f.StringSliceVar(&cfgNames, "configs", cfgNames, "configurations: baseline (always), shortcut, bypass, both, idle (an agent that accelerates nothing: what its programs cost), idle-psock (the same with the read tracepoint refused: reads counted by fexit where allowed, else gauged), idle-refuse:PROG+PROG... (idle with these programs refused as a kernel would refuse them: what each hook costs)")
	f.BoolVar(&quickRun, "quick", false, "2 rounds of 2 s runs (about a minute per mode) unless --rounds or --duration say otherwise")
	f.IntVar(&o.Pairs, "pairs", 0, "paired mode instead of rounds: one agent per node with the bypass and the shortcut, and on the same chain the bypass against its kernel path (paused, programs attached) and the shortcut on the client leg against the kernel path (a fresh connection per phase), this many quads of phases each (an A/A pair and an A/B pair), with 95% bootstrap intervals and per-hook costs (at least 20; 200 for the A/A row to resolve 2%)")
	f.DurationVar(&o.Phase, "phase", 100*time.Millisecond, "with --pairs: the length of each phase")
	return cmd
}

func benchScaleCmd() *cobra.Command {
	o := scale.DefaultOptions()
	steps := []string{"1k", "10k", "100k", "1M"}
	var minAvailGiB float64
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Steps of accelerated connections between two pods (1k to 1M): setup rate, probe RTT and CPU per message, agent memory, listing, scrape, byte-exact uninstall (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Steps, err = scale.ParseSteps(steps); err != nil {
				return fmt.Errorf("--steps: %w", err)
			}
			if minAvailGiB < 0 {
				return fmt.Errorf("--min-available %v: give GiB, at least 0", minAvailGiB)
			}
			o.MinAvailable = uint64(minAvailGiB * (1 << 30))
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log, o.LabVersion = exe, os.Stderr, version
				if o.Agent == "" {
					o.Agent = filepath.Join(filepath.Dir(exe), "eztunnel")
				}
				return scale.Run(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&steps, "steps", steps, "connections of each step, ascending (k and M suffixes); the run stops at the first step the machine cannot hold")
	f.IntVar(&o.Parallel, "parallel", o.Parallel, "connections the holders open (and check) at once, all together; each holder process takes its part")
	f.IntVar(&o.ProbeN, "probe-n", o.ProbeN, "the probe's recorded 24 B round trips in each of its runs")
	f.IntVar(&o.ProbeQuads, "probe-quads", o.ProbeQuads, "the probe's quads of runs at each step (plain TCP and the shortcut alternated, with an A/A pair)")
	f.IntVar(&o.InFlight, "in-flight", o.InFlight, "at most this many connections (every k-th) carry an unread message while the uninstall drains")
	f.Float64Var(&minAvailGiB, "min-available", float64(o.MinAvailable)/(1<<30), "GiB of MemAvailable a step may not go under (it ends the run)")
	f.IntVar(&o.MinSetupRate, "min-setup-rate", o.MinSetupRate, "connections/s: a step whose connections are not all open after a minute plus conns/rate seconds ends the run")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", o.DrainTimeout, "eztunnel uninstall --drain-timeout")
	f.DurationVar(&o.ReaderStop, "reader-stop", o.ReaderStop, "how long the servers stay stopped after the uninstall began, leaving messages unread while it drains")
	f.DurationVar(&o.IdleWindow, "idle-window", o.IdleWindow, "how long the agent's CPU is measured with the connections idle, at each step")
	f.Uint32Var(&o.MaxSockets, "max-sockets", 0, "size every step's maps for at least this many sockets (the agent's --max-sockets; default: what the step needs)")
	f.StringVar(&o.Agent, "agent", "", "the eztunnel agent binary (default: eztunnel next to this binary)")
	f.StringVar(&o.Out, "out", "", "file to write the JSON report to")
	return cmd
}
