package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/bench/hops"
	"github.com/eztunnel/eztunnel/lab/meshlab"
)

func benchHopsCmd() *cobra.Command {
	o := hops.DefaultOptions()
	cmd := &cobra.Command{
		Use:   "hops",
		Short: "Where each hop's time goes on a mesh chain: plain TCP, a naive sockmap and eztunnel, per program (needs root)",
		Long: `Builds the service-mesh lab node (sidecar: app -> outbound HAProxy under
OUTPUT REDIRECT -> inbound HAProxy under PREROUTING REDIRECT -> server;
ambient: app -> node proxy -> server), every process pinned to one CPU, and
runs in --rounds rounds, the order rotated each round, one 24 B back-to-back
ping-echo run per datapath: plain TCP, the lab's naive sockmap (sockops puts
every established socket into a sockhash by 4-tuple and one by client end,
sk_msg redirects to the peer found by address, nothing else) and eztunnel.
Each datapath then runs once more with the kernel's BPF run-time statistics
on. Prints per datapath the median p50 and its change from plain TCP, per
program its runs per round trip and ns per run, and the gap eztunnel - naive
split by program plus the time in no program.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				return hops.Bench(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.Meshes, "mesh", o.Meshes, fmt.Sprintf("mesh modes, in order (%v)", meshlab.Meshes))
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of one run per datapath, order rotated each round")
	f.IntVar(&o.PingN, "ping-n", o.PingN, "recorded round trips per run, on one connection")
	f.IntVar(&o.CPU, "cpu", o.CPU, "CPU every lab process is pinned to")
	f.IntVar(&o.Nice, "nice", o.Nice, "niceness of every lab process")
	f.StringVar(&o.JSON, "json", "", "also write every run's results to this file")
	f.StringVar(&o.LabName, "lab-name", o.LabName, "netlab name of the node (tests run labs side by side)")
	f.IntVar(&o.Subnet, "subnet", o.Subnet, "netlab subnet of the node: 10.77.<subnet>.0/24")
	f.StringVar(&o.PinRoot, "pin-path", o.PinRoot, "bpffs directory the lab's datapath is pinned under")
	for _, h := range []string{"lab-name", "subnet", "pin-path"} {
		f.MarkHidden(h)
	}
	return cmd
}
