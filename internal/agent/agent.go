// Package agent is the node agent's run loop: it checks the kernel and the
// configuration, installs (or adopts) the pinned datapath, serves metrics and
// ages pairing records until its context ends. Stopping it leaves the
// datapath pinned and working.
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// releaseEvery is how often drained ends of connections that switched to
// the kernel path (backpressure) are taken out of the sockhash when sockops
// has not done it at their next segment: FIONREAD is inexact until then.
const releaseEvery = 100 * time.Millisecond

// Config is what `eztunnel run` was told.
type Config struct {
	Cgroups     []string        // managed cgroup v2 subtrees; empty: the cgroup v2 root
	Datapath    datapath.Config // maps, pins and selection rules
	ReadyFile   string          // created once everything is attached (scripts and tests)
	MetricsAddr string          // host:port for /metrics; empty: off
	PairMaxAge  time.Duration   // age after which unfinished pairing records are removed
	Version     string          // reported in eztunnel_agent_info
}

// Run validates cfg, installs the datapath and serves until ctx is done.
// Nothing is changed on the host before every check has passed.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Datapath.Validate(); err != nil {
		return err
	}
	if cfg.PairMaxAge <= 0 {
		return fmt.Errorf("--pair-max-age %s must be positive", cfg.PairMaxAge)
	}
	if len(cfg.Cgroups) == 0 {
		root, err := cgroupv2.Root()
		if err != nil {
			return err
		}
		cfg.Cgroups = []string{root}
	}
	for _, cg := range cfg.Cgroups {
		if err := cgroupv2.Validate(cg); err != nil {
			return err
		}
	}
	if err := bpfsys.Check(datapath.Requirements()); err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}

	msrv, err := listenMetrics(cfg.MetricsAddr)
	if err != nil {
		return err
	}
	dp, err := datapath.Install(cfg.Datapath, cfg.Cgroups)
	if err != nil {
		if msrv != nil {
			msrv.Close()
		}
		return err
	}
	defer dp.Close()
	stopMetrics, err := serveMetrics(ctx, msrv, cfg.Datapath, cfg.Version)
	if err != nil {
		return err
	}
	defer stopMetrics()
	// Loading parsed the kernel's BTF (tens of MB, partly mmapped); nothing
	// needs it any more: give it back before serving for months.
	runtime.GC()
	debug.FreeOSMemory()
	slog.Info("datapath attached", "cgroups", cfg.Cgroups, "pins", cfg.Datapath.Dir())
	if cfg.ReadyFile != "" {
		if err := os.WriteFile(cfg.ReadyFile, []byte("ready\n"), 0o600); err != nil {
			return err
		}
	}

	tick := time.NewTicker(cfg.PairMaxAge / 4)
	defer tick.Stop()
	release := time.NewTicker(releaseEvery)
	defer release.Stop()
	for {
		select {
		case <-ctx.Done():
			slog.Info("stopping; the datapath stays pinned and keeps working", "pins", cfg.Datapath.Dir())
			return nil
		case <-release.C:
			if err := dp.ReleaseSwitched(); err != nil {
				slog.Warn("releasing switched connections", "err", err)
			}
		case <-tick.C:
			if n, err := dp.AgePairs(cfg.PairMaxAge); err != nil {
				slog.Warn("aging pairing records", "err", err)
			} else if n > 0 {
				slog.Info("aged out pairing records", "count", n)
			}
		}
	}
}
