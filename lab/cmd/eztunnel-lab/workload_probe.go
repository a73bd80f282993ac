package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/workload"
)

// workloadProbeCmds are the socket-semantics probe: a server and a client
// that runs one scenario and prints what the application observed.
func workloadProbeCmds() []*cobra.Command {
	return []*cobra.Command{workloadProbeServerCmd(), workloadProbeCmd()}
}

func workloadProbeServerCmd() *cobra.Command {
	var addr, ready string
	cmd := &cobra.Command{
		Use:   "probe-server",
		Short: "Serve socket-semantics probe clients until killed",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return workload.ServeProbe(addr, func() error {
				if ready == "" {
					return nil
				}
				return os.WriteFile(ready, []byte("ready\n"), 0o644)
			})
		},
	}
	cmd.Flags().StringVar(&addr, "addr", ":7100", "listen address ([host]:port; no host is dual-stack)")
	cmd.Flags().StringVar(&ready, "ready-file", "", "file written once listening")
	return cmd
}

func workloadProbeCmd() *cobra.Command {
	var addr, scenario string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Run one socket-semantics scenario and print its observation as JSON",
		Long:  "Scenarios: " + strings.Join(workload.Scenarios(), ", "),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A scenario that hangs is a finding too: say so and exit.
			time.AfterFunc(timeout, func() {
				fmt.Fprintf(os.Stderr, "eztunnel: probe %s: no result after %v\n", scenario, timeout)
				os.Exit(3)
			})
			obs, err := workload.RunProbe(addr, scenario)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(obs)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "probe server ip:port")
	f.StringVar(&scenario, "scenario", "", "scenario name")
	f.DurationVar(&timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}
