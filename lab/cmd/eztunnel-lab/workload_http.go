package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/workload"
)

// workloadHTTPPhasesCmd is bench mesh-matrix --pairs' client in the client
// pod: phases of HTTP requests, one at a time, as stdin asks.
func workloadHTTPPhasesCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "http-phases",
		Short: "Phases of HTTP GETs, one at a time on one connection: per stdin line 'keep|fresh ADDR DURATION', one JSON line (median response time, responses)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return workload.ServeHTTPPhases(os.Stdin, os.Stdout, path)
		},
	}
	cmd.Flags().StringVar(&path, "path", "index.html", "the page asked for")
	return cmd
}

// workloadEchoPhasesCmd is bench lab's paired ping-echo client in the
// client pod: phases of back-to-back round trips on fresh connections, as
// stdin asks.
func workloadEchoPhasesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "echo-phases",
		Short: "Phases of back-to-back ping-echo on fresh connections: per stdin line 'ADDR DURATION CONNS SIZE', one JSON line (median round trip, round trips)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return workload.ServeEchoPhases(os.Stdin, os.Stdout)
		},
	}
}
