// Package agent is the node agent's run loop: it checks the kernel and the
// configuration, takes the node's agent lock, installs (or adopts) the
// pinned datapath, converges what is attached and selected to what it was
// told (cgroups, or in Kubernetes mode the selected pods), serves metrics
// and health, and ages pairing records until its context ends. Stopping it
// leaves the datapath pinned and working.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	lbsvc "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// releaseEvery is how often drained ends of connections that switched to
// the kernel path (backpressure) are taken out of the sockhash when sockops
// has not done it at their next segment: FIONREAD is inexact until then.
const releaseEvery = 100 * time.Millisecond

// reconcileEvery is how often plain mode checks its cgroups (removed,
// re-created) against what is attached.
const reconcileEvery = time.Second

// Config is what `eztunnel run` was told.
type Config struct {
	Cgroups     []string        // managed cgroup v2 subtrees; empty: the cgroup v2 root (plain mode)
	Datapath    datapath.Config // maps, pins and selection rules
	ReadyFile   string          // created once everything is attached (scripts and tests)
	MetricsAddr string          // host:port for /metrics; empty: off
	HealthAddr  string          // host:port for /healthz and /readyz; empty: off
	PairMaxAge  time.Duration   // age after which unfinished pairing records are removed
	Version     string          // reported in eztunnel_agent_info
	LockFile    string          // one agent per node (agentlock)
	Takeover    bool            // ask a running agent to hand over instead of refusing
	LockWait    time.Duration   // how long a takeover waits for the holder
	Kubernetes  *KubeConfig     // Kubernetes mode; nil: plain mode
	// Adoption of connections established before the agent: a round once
	// ready, on SIGUSR1 (`eztunnel adopt`), and every AdoptEvery (0: only
	// those). Off when !Adopt.
	Adopt      bool
	AdoptEvery time.Duration
	// Bypass runs the bridge bypass (pod traffic of one node and between
	// nodes) on the bridges' veths and the uplinks of the agent's network
	// namespace, pinned with the datapath (a restart updates it in place).
	// Off: a bypass an earlier agent pinned is removed. BypassRequired: a
	// node that does not meet the bypass's conditions (bypass.UnmetError)
	// is an error; without it the agent runs without the bypass and says why.
	Bypass         bool
	BypassRequired bool
	// Services runs the Service load balancer (ClusterIP at the socket,
	// NodePort at tc) on the managed cgroups, pinned with the datapath;
	// nil: off, and a load balancer an earlier agent pinned is removed.
	Services *ServicesConfig
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
	if cfg.LockWait <= 0 {
		cfg.LockWait = 60 * time.Second
	}
	var pods *podScope
	if cfg.Kubernetes != nil {
		if len(cfg.Cgroups) > 0 {
			return fmt.Errorf("--cgroup and --kubernetes exclude each other: in Kubernetes mode the pods' root cgroup is attached (--pods-cgroup)")
		}
		var err error
		if pods, err = newPodScope(*cfg.Kubernetes); err != nil {
			return err
		}
		cfg.Cgroups = []string{pods.root}
		cfg.Datapath.CgroupFilter = true
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
	// The bypass's checks (nf_conntrack_tcp_be_liberal) come before anything
	// changes; it is loaded once the datapath is installed (its pins live there).
	bypassOff := ""
	if cfg.Bypass {
		if err := checkBypass(); err != nil {
			var unmet *bypass.UnmetError
			if !errors.As(err, &unmet) || cfg.BypassRequired {
				return fmt.Errorf("--bypass: %w", err)
			}
			slog.Warn("running without the bridge bypass (on by default where the node allows it; --bypass=false silences this)", "reason", err.Error())
			cfg.Bypass, bypassOff = false, err.Error()
		}
	} else {
		bypassOff = "off (--bypass=false)"
	}
	if cfg.Services != nil {
		if err := checkServices(*cfg.Services); err != nil {
			return err
		}
	}

	// The lock first: during a DaemonSet update with maxSurge the agent we
	// take over from holds the health and metrics ports (host network) until
	// it hands over.
	lock, err := agentlock.Acquire(cfg.LockFile, agentlock.Owner(), cfg.Takeover, cfg.LockWait)
	if errors.Is(err, agentlock.ErrSuperseded) {
		// This pod is being replaced and its container was restarted.
		slog.Info("standing by until stopped: a newer agent manages the datapath", "reason", err.Error())
		<-ctx.Done()
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Release()
	hl, err := listenHealth(cfg.HealthAddr)
	if err != nil {
		return err
	}
	defer hl.close()
	msrv, err := listenMetrics(cfg.MetricsAddr)
	if err != nil {
		return err
	}
	closeMetrics := func() {
		if msrv != nil {
			msrv.Close()
		}
	}
	stopHealth := hl.serve(ctx)
	defer stopHealth()

	dp, err := datapath.Install(cfg.Datapath, cfg.Cgroups)
	if err != nil {
		closeMetrics()
		return err
	}
	defer dp.Close()
	if pruned := dp.Pruned(); len(pruned) > 0 {
		slog.Info("detached cgroups no longer managed (or removed)", "cgroup_ids", pruned)
	}
	var bb *bridgeBypass
	if cfg.Bypass {
		if bb, err = loadBypass(cfg.Datapath.Dir()); err != nil && cfg.BypassRequired {
			closeMetrics()
			return err
		}
		if err != nil {
			// A kernel without one of its programs' needs (tcx, a kfunc,
			// a BTF field): the rest runs (docs/kernels.md).
			slog.Warn("running without the bridge bypass: this kernel refused it", "reason", err.Error())
			cfg.Bypass, bypassOff = false, err.Error()
		}
	}
	if cfg.Bypass {
		defer bb.close()
		if pods != nil {
			// The node's pods from the API: managed neighbour entries, so
			// every pod is an endpoint (neighbours.go).
			bb.neigh = newPodNeighbours()
			pods.cfg.PodIPs = bb.neigh.setPods
		}
	} else {
		if n, err := bypass.Unpin(cfg.Datapath.Dir()); err != nil {
			closeMetrics()
			return fmt.Errorf("remove the bridge bypass of an earlier agent: %w", err)
		} else if n > 0 {
			slog.Info("removed the bridge bypass an earlier agent pinned", "links", n)
		}
		RemoveManagedNeighbours()
	}
	var svc *serviceLB
	if cfg.Services != nil {
		if cfg.Kubernetes != nil { // the pods' cgroups where Kubernetes mode finds them
			cfg.Services.Pods.PodsCgroup, cfg.Services.Pods.Driver = cfg.Kubernetes.PodsCgroup, cfg.Kubernetes.Driver
			cfg.Services.Pods.Cgroup2Root = cfg.Kubernetes.Cgroup2Root
		}
		if svc, err = loadServices(*cfg.Services, cfg.Datapath.Dir()); err != nil {
			closeMetrics()
			return err
		}
		if pods != nil {
			svc.pods = pods.watch
		}
		defer svc.close()
	} else if n, err := lbsvc.Unpin(cfg.Datapath.Dir()); err != nil {
		closeMetrics()
		return fmt.Errorf("remove the Service load balancer of an earlier agent: %w", err)
	} else if n > 0 {
		slog.Info("removed the Service load balancer an earlier agent pinned", "cgroups", n)
	}
	if pods == nil {
		// Plain mode selects whole subtrees: a selection left by a
		// Kubernetes-mode agent means nothing now.
		if _, n, err := dp.SetScope(nil); err != nil {
			return err
		} else if n > 0 {
			slog.Info("cleared the pod selection of an earlier Kubernetes-mode agent", "cgroups", n)
		}
	}
	rep := partsReport(dp, bypassOff, svc)
	logParts(rep)
	if err := rep.Write(parts.ReportPath(cfg.Datapath.Dir())); err != nil {
		slog.Warn("cannot write the parts report `eztunnel status` reads", "err", err)
	}
	stopMetrics, err := serveMetrics(ctx, msrv, cfg.Datapath, cfg.Version, pods, bb, bypassOff, svc, rep)
	if err != nil {
		return err
	}
	defer stopMetrics()
	stopPods, err := watchPods(ctx, dp, cfg.Cgroups, bb)
	if err != nil {
		if bb != nil {
			err = fmt.Errorf("--bypass: %w", err)
		}
		return err
	}
	defer stopPods()
	stopBypass := func() {}
	if bb != nil {
		bb.prune() // what an earlier agent pinned and the first convergence did not want
		bb.logAttached()
		stopBypass = bb.close
	}
	stopServices := func() {}
	if svc != nil {
		if err := svc.start(ctx, cfg.Cgroups); err != nil {
			return err
		}
		stopServices = svc.close
	}
	// Loading parsed the kernel's BTF (tens of MB, partly mmapped); nothing
	// needs it any more: give it back before serving for months.
	runtime.GC()
	debug.FreeOSMemory()
	slog.Info("datapath attached", "cgroups", cfg.Cgroups, "pins", cfg.Datapath.Dir(), "kubernetes", pods != nil)

	ev := kubeEvents{synced: closedChan()}
	kctx, stopKube := context.WithCancel(ctx)
	defer stopKube()
	if pods != nil {
		if ev, err = pods.start(kctx, dp); err != nil {
			return err
		}
	}
	synced := ev.synced
	hl.setReady(false, "waiting for the first sync of the pods")

	adoptNow := make(chan os.Signal, 1)
	signal.Notify(adoptNow, syscall.SIGUSR1)
	defer signal.Stop(adoptNow)
	var adoptTick <-chan time.Time
	if cfg.Adopt && cfg.AdoptEvery > 0 {
		t := time.NewTicker(cfg.AdoptEvery)
		defer t.Stop()
		adoptTick = t.C
	}
	// A round runs beside the loop: it visits every pod's namespace (about
	// 25 ms each in the e2e tests here), so 500 pods would take longer than
	// the health check allows the loop to stall;
	// the token lets one run at a time, and is taken back before the
	// datapath is closed.
	idle := make(chan struct{}, 1)
	idle <- struct{}{}
	defer func() { <-idle }() // runs before the deferred dp.Close
	// waitRound waits for a round in progress to end.
	waitRound := func() { <-idle; idle <- struct{}{} }
	warnedDenied := false
	adoptOff, _ := rep.Get(parts.Adoption)
	adopt := func(why string) {
		if !cfg.Adopt {
			slog.Info("adoption is off (--adopt=false): nothing done", "trigger", why)
			return
		}
		if !adoptOff.Runs {
			slog.Info("adoption is off on this kernel: nothing done", "trigger", why, "reason", adoptOff.Reason)
			return
		}
		select {
		case <-idle:
		default:
			return // a round is running; this request is served by it
		}
		go func() {
			defer func() { idle <- struct{}{} }()
			rep, err := dp.Adopt(cfg.Cgroups)
			if err != nil {
				slog.Warn("adoption round", "err", err)
			}
			if rep.Denied > 0 && !warnedDenied {
				warnedDenied = true
				slog.Warn("adoption cannot open the network namespace of some processes of the managed cgroups: it needs CAP_SYS_ADMIN, CAP_SYS_PTRACE and the host PID namespace (chart: adoption.enabled=true)", "processes", rep.Denied)
			}
			if rep.Adopted > 0 || len(rep.Skipped) > 0 || why != "interval" {
				slog.Info("adoption round", "trigger", why, "namespaces", rep.Namespaces, "sockets", rep.Sockets,
					"candidates", rep.Candidates, "adopted", rep.Adopted, "skipped", rep.Skipped, "took", rep.Took)
			}
		}()
	}

	tick := time.NewTicker(cfg.PairMaxAge / 4)
	defer tick.Stop()
	release := time.NewTicker(releaseEvery)
	defer release.Stop()
	reconcile := time.NewTicker(reconcileEvery)
	defer reconcile.Stop()
	for {
		hl.tick()
		select {
		case <-ctx.Done():
			slog.Info("stopping; the datapath stays pinned and keeps working", "pins", cfg.Datapath.Dir())
			return nil
		case <-synced:
			synced = nil
			hl.setReady(true, "")
			// Plain mode: at once (synced is closed); Kubernetes mode: after
			// the first selection is applied.
			if cfg.ReadyFile != "" {
				if err := os.WriteFile(cfg.ReadyFile, []byte("ready\n"), 0o600); err != nil {
					return err
				}
			}
			slog.Info("ready")
			if cfg.Adopt {
				adopt("start")
			}
		case <-adoptNow:
			if synced == nil {
				adopt("request")
			}
		case <-adoptTick:
			if synced == nil {
				adopt("interval")
			}
		case err := <-ev.failed:
			return fmt.Errorf("watching the node's pods: %w", err)
		case <-ev.removed:
			// Our DaemonSet is gone: this is `helm uninstall`, not an update.
			stopKube()
			hl.setReady(false, "uninstalling: the agent's DaemonSet was deleted")
			waitRound() // no round while the datapath is drained
			stopPods()
			stopBypass()
			stopServices()
			return uninstallOnRemoval(ctx, dp, cfg, lock)
		case who := <-lock.Requested():
			// Everything the next agent needs goes before the lock: our
			// hold on the datapath, and the health and metrics ports.
			stopKube()
			hl.setReady(false, "handed over to "+who)
			slog.Info("handing the datapath over; standing by until stopped (the datapath stays pinned)", "to", who)
			waitRound() // the round in progress ends before the datapath closes
			stopPods()
			dp.Close()
			stopBypass() // pinned: the next agent updates it in place
			stopServices()
			stopMetrics()
			stopHealth()
			lock.Release()
			<-ctx.Done()
			return nil
		case <-reconcile.C:
			if pods != nil {
				continue // the pods' root stays; pods converge through the selection
			}
			attached, missing, pruned, err := dp.ReconcileCgroups(cfg.Cgroups)
			if err != nil {
				slog.Warn("reconciling cgroups", "err", err)
			}
			if len(attached)+len(pruned) > 0 {
				slog.Info("cgroups reconciled", "attached", attached, "detached_ids", pruned, "missing", missing)
			}
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

func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
