package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/workload"
)

// workloadConnectCmds are bench services' probes: connect latency to
// random targets, and the time a connect first gets the wanted outcome.
func workloadConnectCmds() []*cobra.Command {
	return []*cobra.Command{workloadConnectCmd(), workloadConnectUntilCmd()}
}

func workloadConnectCmd() *cobra.Command {
	var file string
	var n int
	var seed uint64
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "connect",
		Short: "Time n new TCP connects, each to a random target of --targets-file (one host:port a line); JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			targets := strings.Fields(string(b))
			res, err := workload.ConnectLatency(targets, n, timeout, seed)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&file, "targets-file", "", "file of host:port targets")
	f.IntVar(&n, "n", 1000, "connects")
	f.Uint64Var(&seed, "seed", 1, "random seed")
	f.DurationVar(&timeout, "timeout", time.Second, "connect timeout")
	return cmd
}

func workloadConnectUntilCmd() *cobra.Command {
	var addr string
	var refused bool
	var interval, timeout time.Duration
	cmd := &cobra.Command{
		Use:   "connect-until",
		Short: "Print 'ready', wait for a line on stdin, then connect to --addr until the wanted outcome; print its unix nanoseconds",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Println("ready")
			if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
				return fmt.Errorf("waiting for the go line: %w", err)
			}
			t, err := workload.ConnectUntil(addr, refused, interval, timeout)
			if err != nil {
				return err
			}
			fmt.Println(t.UnixNano())
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "host:port")
	f.BoolVar(&refused, "refused", false, "wait for ECONNREFUSED instead of a connection")
	f.DurationVar(&interval, "interval", time.Millisecond, "pause between connects")
	f.DurationVar(&timeout, "timeout", time.Minute, "give up after this long")
	return cmd
}
