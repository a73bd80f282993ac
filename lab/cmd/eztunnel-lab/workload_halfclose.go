package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/workload"
)

// workloadHalfCloseCmds are the half-close exchanges: a server and a client
// that runs many and prints what it observed.
func workloadHalfCloseCmds() []*cobra.Command {
	return []*cobra.Command{workloadHalfCloseServerCmd(), workloadHalfCloseCmd()}
}

func workloadHalfCloseServerCmd() *cobra.Command {
	var addr, ready string
	cmd := &cobra.Command{
		Use:   "halfclose-server",
		Short: "Serve half-close clients until killed (problems and EAGAINs on stderr)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return workload.ServeHalfClose(addr, func() error {
				if ready == "" {
					return nil
				}
				return os.WriteFile(ready, []byte("ready\n"), 0o644)
			})
		},
	}
	cmd.Flags().StringVar(&addr, "addr", ":7400", "listen address ([host]:port; no host is dual-stack)")
	cmd.Flags().StringVar(&ready, "ready-file", "", "file written once listening")
	return cmd
}

func workloadHalfCloseCmd() *cobra.Command {
	var o workload.HalfCloseOptions
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "halfclose",
		Short: "Run half-close exchanges on blocking sockets and print what they observed as JSON",
		RunE: func(cmd *cobra.Command, _ []string) error {
			time.AfterFunc(timeout, func() {
				fmt.Fprintf(os.Stderr, "eztunnel: halfclose: no result after %v\n", timeout)
				os.Exit(3)
			})
			rep, err := workload.RunHalfClose(o)
			if rep != nil {
				json.NewEncoder(os.Stdout).Encode(rep)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Addr, "addr", "", "halfclose-server ip:port")
	f.StringVar(&o.Mode, "mode", "c", "c: the client half-closes; s: the server half-closes first")
	f.IntVar(&o.Exchanges, "exchanges", 1000, "exchanges, one after the other")
	f.IntVar(&o.Up, "up", 500, "bytes client -> server per exchange")
	f.IntVar(&o.Down, "down", 2000, "bytes server -> client per exchange")
	f.DurationVar(&o.Delay, "delay", 0, "the answering side waits this long before answering ...")
	f.IntVar(&o.DelayEvery, "delay-every", 0, "... in every n-th exchange (0: never)")
	f.IntVar(&o.Banner, "banner", 0, "mode c: bytes the server sends first, read by the client only after its shutdown")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "give up after this long")
	return cmd
}
