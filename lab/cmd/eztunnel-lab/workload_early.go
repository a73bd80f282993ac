package main

import (
	"encoding/json"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/workload"
)

func workloadEarlyCmd() *cobra.Command {
	var addr string
	var conns, size int
	cmd := &cobra.Command{
		Use:   "early",
		Short: "Connections one after the other, each writing right after connect(), then reading the echo",
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := workload.EarlyWrites(addr, conns, size)
			if err != nil {
				return err
			}
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "echo server host:port")
	cmd.Flags().IntVar(&conns, "conns", 1000, "connections")
	cmd.Flags().IntVar(&size, "size", 24, "bytes written on each connection (at least 8)")
	return cmd
}
