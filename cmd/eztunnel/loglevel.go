package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// logLevelCmd changes the running agent's log level without a restart: it
// writes the level where the agent looks (nodelayout.Layout.LogLevel) and
// sends it SIGUSR2. The level holds until the agent stops; its next start
// takes --log-level again.
func logLevelCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var lockFile string
	cmd := &cobra.Command{
		Use:   "log-level debug|info|warn|error",
		Short: "Change the running agent's log level (until it stops)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := cli.ParseLogLevel(args[0]); err != nil {
				return cli.UsageError{Err: err}
			}
			if lockFile == "" {
				lockFile = cfg.Layout().Lock()
			}
			rec, err := agentlock.HolderRecord(lockFile)
			if err != nil {
				return fmt.Errorf("lock %s: %w", lockFile, err)
			}
			pid := rec.PID
			if !slices.Contains(strings.Fields(rec.Signals), "SIGUSR2") || pid == 0 {
				return fmt.Errorf("the lock's holder (%s, version %q) does not take SIGUSR2: an agent older than log-level, or not an agent; nothing sent", rec.Holder, rec.Version)
			}
			if err := os.WriteFile(cfg.Layout().LogLevel(), []byte(args[0]+"\n"), 0o644); err != nil {
				return err
			}
			if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
				return fmt.Errorf("signal the agent (pid %d): %w", pid, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "asked the agent (pid %d) for log level %s\n", pid, args[0])
			return nil
		},
	}
	layoutFlags(cmd.Flags(), &cfg, &lockFile)
	return cmd
}

// followLogLevel sets the log level written to path each time the process
// gets SIGUSR2 (`eztunnel log-level`), until the returned stop.
func followLogLevel(path string) (stop func()) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR2)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-sig:
			}
			b, err := os.ReadFile(path)
			if err != nil {
				slog.Warn("log level: SIGUSR2 without a level to read", "file", path, "err", err)
				continue
			}
			l, err := cli.ParseLogLevel(strings.TrimSpace(string(b)))
			if err != nil {
				slog.Warn("log level: not changed", "file", path, "err", err)
				continue
			}
			cli.SetLogLevel(l)
			slog.Warn("log level changed", "level", l.String()) // shown unless the level is error
		}
	}()
	return func() { signal.Stop(sig); close(done) }
}
