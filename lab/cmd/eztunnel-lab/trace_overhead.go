package main

import (
	"context"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/tracebench"
)

func traceOverheadCmd() *cobra.Command {
	o := tracebench.Options{RTTN: 20000, Bytes: 1 << 30}
	cmd := &cobra.Command{
		Use:   "overhead",
		Short: "Nanoseconds per probe and the effect on pod-to-pod RTT and throughput (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				return tracebench.Overhead(ctx, o, os.Stdout)
			})
		},
	}
	cmd.Flags().IntVar(&o.RTTN, "rtt-n", o.RTTN, "recorded 24 B round trips per measurement")
	cmd.Flags().Uint64Var(&o.Bytes, "bytes", o.Bytes, "bytes of the throughput transfer")
	return cmd
}
