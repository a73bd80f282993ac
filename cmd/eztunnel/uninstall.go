package main

import (
	"errors"
	"log/slog"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
)

func uninstallCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var drain, lockWait time.Duration
	var lockFile string
	cmd := &cobra.Command{
		Use:   "uninstall",
		Short: "Stop enrolling sockets, wait for accelerated connections to end, remove every program and pin",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A running agent would put back what this removes: it hands
			// over first and stands by until stopped.
			if lockFile == "" {
				lockFile = cfg.Layout().Lock()
			}
			lock, err := agentlock.Acquire(lockFile, "eztunnel uninstall", true, lockWait)
			if err != nil {
				return err
			}
			// The managed neighbour entries a Kubernetes-mode agent kept
			// for the bypass (pinned or not: they are the node's).
			bypass.RemoveManagedNeighbours()
			if err := datapath.Uninstall(cfg, drain); err != nil {
				if errors.Is(err, datapath.ErrNotInstalled) {
					lock.Remove() // nothing to manage: no lock file either
				} else {
					lock.Release()
				}
				return err
			}
			lock.Remove()
			slog.Info("uninstalled", "pins", cfg.Dir())
			return nil
		},
	}
	layoutFlags(cmd.Flags(), &cfg, &lockFile)
	cmd.Flags().DurationVar(&drain, "drain-timeout", 30*time.Second, "how long to wait for accelerated connections to close")
	cmd.Flags().DurationVar(&lockWait, "takeover-timeout", 60*time.Second, "how long to wait for the running agent to hand over the node's lock (as eztunnel run --takeover-timeout)")
	return cmd
}
