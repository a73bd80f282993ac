package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/tracebench"
)

func traceOverheadCmd() *cobra.Command {
	o := tracebench.Options{RTTN: 20000, Bytes: 1 << 30}
	cmd := &cobra.Command{
		Use:   "overhead",
		Short: "Nanoseconds per probe and the effect on pod-to-pod RTT and throughput (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find own binary: %w", err)
			}
			o.Exe, o.Log = exe, os.Stderr
			return tracebench.Overhead(ctx, o, os.Stdout)
		},
	}
	cmd.Flags().IntVar(&o.RTTN, "rtt-n", o.RTTN, "recorded 24 B round trips per measurement")
	cmd.Flags().Uint64Var(&o.Bytes, "bytes", o.Bytes, "bytes of the throughput transfer")
	return cmd
}
