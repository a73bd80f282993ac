package main

import (
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

func uninstallCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var drain time.Duration
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Stop enrolling sockets, wait for accelerated connections to end, remove every program and pin",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := datapath.Uninstall(cfg, drain); err != nil {
				return err
			}
			slog.Info("uninstalled", "pins", cfg.Dir())
			return nil
		},
	}
	cmd.Flags().StringVar(&cfg.PinRoot, "pin-path", cfg.PinRoot, "bpffs directory of the pinned datapath")
	cmd.Flags().DurationVar(&drain, "drain-timeout", 30*time.Second, "how long to wait for accelerated connections to close")
	return cmd
}
