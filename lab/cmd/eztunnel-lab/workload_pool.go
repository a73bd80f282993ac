package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/workload"
)

// workloadPoolCmds: a pool of connections used before and after the agent
// starts (adoption tests and benchmark).
func workloadPoolCmds() []*cobra.Command {
	var addr, ready string
	server := &cobra.Command{
		Use:   "pool-server",
		Short: "Echo every connection, with Go's netpoller (non-blocking sockets, epoll), until killed",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			if ready != "" {
				if err := os.WriteFile(ready, []byte("ready\n"), 0o644); err != nil {
					return err
				}
			}
			return workload.ServePool(ln)
		},
	}
	server.Flags().StringVar(&addr, "addr", ":7300", "listen address")
	server.Flags().StringVar(&ready, "ready-file", "", "file written once listening")

	cfg := workload.PoolConfig{}
	client := &cobra.Command{
		Use:   "pool",
		Short: "Open a pool, use it, write --ready-file, wait for --go-file, use it again (or stream until --stop-file); print JSON",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Stream && cfg.Stop == "" {
				return fmt.Errorf("--stream needs --stop-file")
			}
			res, err := workload.Pool(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	f := client.Flags()
	f.StringVar(&cfg.Addr, "addr", "", "pool server host:port")
	f.IntVar(&cfg.Conns, "conns", 10, "connections")
	f.IntVar(&cfg.Rounds, "rounds", 20, "exchanges per connection in each phase")
	f.StringVar(&cfg.Ready, "ready-file", "", "written after phase 1")
	f.StringVar(&cfg.Go, "go-file", "", "phase 2 starts once this file exists")
	f.BoolVar(&cfg.Stream, "stream", false, "phase 2 streams both ways in bursts until --stop-file exists")
	f.StringVar(&cfg.Stop, "stop-file", "", "ends --stream")
	f.DurationVar(&cfg.MaxGap, "max-gap", 5*time.Millisecond, "longest pause between bursts (--stream)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the byte streams")
	f.BoolVar(&cfg.FIONREAD, "fionread", false, "phase 2: every echo must show whole in FIONREAD before it is read")
	f.BoolVar(&cfg.Unread, "unread", false, "phase 1 ends with an echo left unread (read first in phase 2)")
	f.BoolVar(&cfg.Blocking, "blocking", false, "phase 2: a thread per connection on a blocking socket, recv with SO_RCVTIMEO 1 ms in a loop, requests every few ms, until --stop-file")
	f.DurationVar(&cfg.Timeout, "timeout", 5*time.Minute, "give up after this long")
	var paddr, pdir string
	var pconns, pn, phases int
	ping := &cobra.Command{
		Use:   "pool-ping",
		Short: "Open a pool, then per phase wait for <dir>/go-<p>, measure 24 B round trips, write <dir>/done-<p>; print JSON",
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := workload.PoolPing(cmd.Context(), paddr, pconns, pn, phases, pdir)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	ping.Flags().StringVar(&paddr, "addr", "", "pool server host:port")
	ping.Flags().IntVar(&pconns, "conns", 8, "connections")
	ping.Flags().IntVar(&pn, "n", 2000, "round trips per connection and phase")
	ping.Flags().IntVar(&phases, "phases", 2, "phases")
	ping.Flags().StringVar(&pdir, "dir", "", "directory of the go-/done- files")
	// For images without a shell (the Kubernetes tests): create a file, or
	// fail unless one exists.
	touch := &cobra.Command{
		Use: "touch FILE", Short: "Create an empty file", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return os.WriteFile(args[0], nil, 0o644) },
	}
	waitFile := &cobra.Command{
		Use: "wait-file FILE", Short: "Succeed if FILE exists, fail otherwise", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := os.Stat(args[0])
			return err
		},
	}
	return []*cobra.Command{server, client, ping, touch, waitFile}
}
