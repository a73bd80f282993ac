package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/probe"
)

type runConfig struct {
	cgroups   []string
	dp        datapath.Config
	readyFile string
	metrics   string
	selection selectionFlags
	pairAge   time.Duration
}

func runCmd() *cobra.Command {
	rc := runConfig{dp: datapath.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Attach the socket shortcut and serve until stopped (the datapath stays pinned)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, rc)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&rc.cgroups, "cgroup", nil, "cgroup v2 path(s) to manage (default: the cgroup v2 root from /proc/mounts)")
	f.StringVar(&rc.dp.PinRoot, "pin-path", rc.dp.PinRoot, "bpffs directory for the pinned datapath")
	f.Uint32Var(&rc.dp.MaxSockets, "max-sockets", rc.dp.MaxSockets, "sockhash size (two entries per accelerated connection)")
	f.Uint32Var(&rc.dp.MaxPairs, "max-pairs", rc.dp.MaxPairs, "connections in setup at once")
	f.StringVar(&rc.readyFile, "ready-file", "", "file created once everything is attached (for scripts and tests)")
	f.DurationVar(&rc.pairAge, "pair-max-age", 60*time.Second, "age after which unclaimed or ambiguous pairing records are removed")
	rc.selection.register(f)
	f.StringVar(&rc.metrics, "metrics-addr", "", "serve Prometheus metrics on this host:port at /metrics (default off)")
	f.MarkHidden("ready-file")
	return cmd
}

func run(ctx context.Context, rc runConfig) error {
	sel, err := rc.selection.parse()
	if err != nil {
		return err
	}
	rc.dp.Select = sel
	if err := rc.dp.Validate(); err != nil {
		return err
	}
	if rc.pairAge <= 0 {
		return fmt.Errorf("--pair-max-age %s must be positive", rc.pairAge)
	}
	if len(rc.cgroups) == 0 {
		root, err := cgroupv2.Root()
		if err != nil {
			return err
		}
		rc.cgroups = []string{root}
	}
	for _, cg := range rc.cgroups {
		if err := cgroupv2.Validate(cg); err != nil {
			return err
		}
	}
	if err := probe.Check(probe.Shortcut); err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}

	msrv, err := listenMetrics(rc.metrics)
	if err != nil {
		return err
	}
	dp, err := datapath.Install(rc.dp, rc.cgroups)
	if err != nil {
		if msrv != nil {
			msrv.Close()
		}
		return err
	}
	defer dp.Close()
	stopMetrics, err := serveMetrics(ctx, msrv, rc.dp)
	if err != nil {
		return err
	}
	defer stopMetrics()
	// Loading parsed the kernel's BTF (tens of MB, partly mmapped); nothing
	// needs it any more: give it back before serving for months.
	runtime.GC()
	debug.FreeOSMemory()
	slog.Info("datapath attached", "cgroups", rc.cgroups, "pins", rc.dp.Dir())
	if rc.readyFile != "" {
		if err := os.WriteFile(rc.readyFile, []byte("ready\n"), 0o600); err != nil {
			return err
		}
	}

	tick := time.NewTicker(rc.pairAge / 4)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			slog.Info("stopping; the datapath stays pinned and keeps working", "pins", rc.dp.Dir())
			return nil
		case <-tick.C:
			if n, err := dp.AgePairs(rc.pairAge); err != nil {
				slog.Warn("aging pairing records", "err", err)
			} else if n > 0 {
				slog.Info("aged out pairing records", "count", n)
			}
		}
	}
}
