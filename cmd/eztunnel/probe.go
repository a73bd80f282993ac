package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/eztunnel/eztunnel/internal/probe"
	"github.com/spf13/cobra"
)

// probeCmd is what `kubectl eztunnel connectivity` runs in its test pods
// (the agent's image, no privilege): an echo server, and a client that
// checks every byte and tells from the kernel's TCP counters whether the
// bytes took the shortcut.
func probeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Connectivity probes (what kubectl eztunnel connectivity runs in its pods)",
	}
	cmd.AddCommand(probeServeCmd(), probeCheckCmd())
	return cmd
}

func probeServeCmd() *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Echo every byte back on each TCP connection until stopped",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			go func() { <-ctx.Done(); ln.Close() }()
			for {
				c, err := ln.Accept()
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				go func() {
					defer c.Close()
					probe.Echo(c)
				}()
			}
		},
	}
	cmd.Flags().StringVar(&addr, "addr", ":7070", "the address to listen on")
	return cmd
}

func probeCheckCmd() *cobra.Command {
	var addrs []string
	var size, conns int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Send bytes to echo servers, check each byte back, and print per connection whether it took the shortcut (JSON)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if size < 1 || conns < 1 {
				return fmt.Errorf("--bytes %d and --conns %d must be at least 1", size, conns)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			var mu sync.Mutex
			var res []probe.Result
			var wg sync.WaitGroup
			for _, a := range addrs {
				for range conns {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := probe.Check(ctx, a, size)
						mu.Lock()
						res = append(res, r)
						mu.Unlock()
					}()
				}
			}
			wg.Wait()
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(res)
		},
	}
	cmd.Flags().StringSliceVar(&addrs, "addr", nil, "echo servers (host:port), each checked --conns times")
	cmd.Flags().IntVar(&size, "bytes", 1<<20, "bytes sent on each connection")
	cmd.Flags().IntVar(&conns, "conns", 2, "connections to each server")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "for the whole check")
	cmd.MarkFlagRequired("addr")
	return cmd
}
