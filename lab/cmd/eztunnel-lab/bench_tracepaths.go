package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/bench/tracepaths"
)

func benchTracePathsCmd() *cobra.Command {
	o := tracepaths.Options{Rounds: 5, N: 5000, Size: 64, Protos: []string{"tcp", "udp"}, ClientCPU: 1, ServerCPU: 1}
	var quick bool
	cmd := &cobra.Command{
		Use: "trace-paths",
		Short: "The lattrace thesis' CNI comparison with eztunnel trace: time per direction and namespace (median, PDV) " +
			"for bridge vs tc bypass vs bypass + shortcut, same-node and cross-node, TCP and UDP request/response (needs root)",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if quick {
				o.Rounds, o.N = 2, 1000
			}
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Lab, o.Agent = exe, filepath.Join(filepath.Dir(exe), "eztunnel")
				return tracepaths.Run(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "2 rounds of 1000 exchanges (about a minute)")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "interleaved rounds of the three datapaths")
	f.IntVar(&o.N, "n", o.N, "request/response exchanges per run")
	f.IntVar(&o.Size, "size", o.Size, "bytes of each request and response")
	f.StringSliceVar(&o.Protos, "protos", o.Protos, "protocols: tcp, udp")
	f.BoolVar(&o.NF, "nf", false, "also time the nodes' netfilter tables (BPF netfilter links: more probes on the kernel path)")
	f.StringVar(&o.CSVDir, "csv", "", "write every run's records to DIR/<round>-<datapath>-<pair>-<proto>.csv (DIR must exist)")
	f.IntVar(&o.ClientCPU, "client-cpu", o.ClientCPU, "CPU of the client (-1: any)")
	f.IntVar(&o.ServerCPU, "server-cpu", o.ServerCPU, "CPU of the servers (-1: any)")
	return cmd
}
