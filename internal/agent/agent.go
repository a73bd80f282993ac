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
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	"github.com/eztunnel/eztunnel/internal/datapath/services/svcsync"
	"github.com/eztunnel/eztunnel/internal/kube"
	"github.com/eztunnel/eztunnel/internal/metrics"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// releaseEvery is how often drained ends of connections that switched to
// the kernel path (backpressure) are taken out of the sockhash when sockops
// has not done it at their next segment: FIONREAD is inexact until then.
// After releaseIdleAfter looks that found nothing to do, the interval
// doubles up to releaseIdleEvery, and comes back to releaseEvery as soon
// as a look finds a switch: an agent with nothing to release wakes up
// twice a second for it, not ten times.
const (
	releaseEvery     = 100 * time.Millisecond
	releaseIdleEvery = 500 * time.Millisecond
	releaseIdleAfter = 10
)

// releaseBackoff is the interval before the next look for switched ends,
// after one that was busy or not.
type releaseBackoff struct {
	every time.Duration
	quiet int
}

func (r *releaseBackoff) next(busy bool) time.Duration {
	switch {
	case busy || r.every == 0:
		r.every, r.quiet = releaseEvery, 0
	case r.quiet < releaseIdleAfter:
		r.quiet++
	default:
		r.every = min(2*r.every, releaseIdleEvery)
	}
	return r.every
}

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
	// Services runs the Service load balancer (ClusterIP at the socket,
	// NodePort at tc) on the managed cgroups, pinned with the datapath;
	// off (!Services.On): a load balancer an earlier agent pinned is
	// removed.
	Services svcsync.Options
}

// Run validates cfg, installs the datapath and serves until ctx is done.
// Nothing is changed on the host before every check has passed. It reads
// as the agent's parts in their order: checks, the node lock, health and
// metrics listeners, the datapath and its families, what converges them,
// then the loop; each part's stop is recorded in a lifecycle and run in the
// reverse order.
func Run(ctx context.Context, cfg Config) error {
	a, err := check(cfg)
	if err != nil {
		return err
	}
	// The lock first: during a DaemonSet update with maxSurge the agent we
	// take over from holds the health and metrics ports (host network) until
	// it hands over.
	lock, err := agentlock.Acquire(a.cfg.LockFile, agentlock.Owner(), a.cfg.Takeover, a.cfg.LockWait)
	if errors.Is(err, agentlock.ErrSuperseded) {
		// This pod is being replaced and its container was restarted.
		slog.Info("standing by until stopped: a newer agent manages the datapath", "reason", err.Error())
		<-ctx.Done()
		return nil
	}
	if err != nil {
		return err
	}
	a.lock = lock
	a.parts.add(lock.Release)
	defer func() {
		if err := a.parts.stop(); err != nil {
			slog.Warn("stopping the agent's parts", "err", err)
		}
	}()
	for _, start := range []func(context.Context) error{a.listen, a.install, a.families, a.converge} {
		if err := start(ctx); err != nil {
			return err
		}
	}
	return a.serve(ctx)
}

// agent is a running agent: its configuration, the parts it started and
// their stops (parts).
type agent struct {
	cfg   Config
	pods  *podScope // Kubernetes mode; nil: plain mode
	parts lifecycle

	lock *agentlock.Lock
	hl   *health
	msrv *metrics.Server // nil: no metrics
	dp   *datapath.Datapath
	bb   *bypass.Node  // nil: no bypass
	svc  *svcsync.Node // nil: no Service load balancer
	// nodes are the families' node sides that run (bb and svc when not
	// nil), which the agent serves, asks and stops alike (families.go).
	nodes []familyNode
	rep   parts.Report
	// Stops the loop calls before the datapath is closed or uninstalled
	// (a handover, the DaemonSet's removal); nil: not started.
	stopPods func() error
	// testScope: plain mode with a fixed pod selection (testScopeEnv).
	testScope []string
}

// testScopeEnv makes plain mode select pods as Kubernetes mode does, with a
// fixed selection: the cgroups it names (comma-separated paths inside
// --cgroup). The benches measure the paths of pods that are not selected
// with it, without a cluster. Never set it in production.
const testScopeEnv = "EZTUNNEL_TEST_SCOPE"

// ValidateConfig checks what needs neither the node nor the cluster: the
// values and how they combine (`eztunnel run --dry-run`; Run checks them
// first, then the node).
func ValidateConfig(cfg Config) error {
	if err := cfg.Datapath.Validate(); err != nil {
		return err
	}
	if cfg.PairMaxAge <= 0 {
		return fmt.Errorf("--pair-max-age %s must be positive", cfg.PairMaxAge)
	}
	if cfg.LockWait < 0 {
		return fmt.Errorf("--takeover-timeout %s must not be negative", cfg.LockWait)
	}
	if k := cfg.Kubernetes; k != nil {
		if len(cfg.Cgroups) > 0 {
			return fmt.Errorf("--cgroup and --kubernetes exclude each other: in Kubernetes mode the pods' root cgroup is attached (--pods-cgroup)")
		}
		if err := k.check(); err != nil {
			return err
		}
	}
	for flag, addr := range map[string]string{"--metrics-addr": cfg.MetricsAddr, "--health-addr": cfg.HealthAddr} {
		if err := checkListenAddr(addr); err != nil {
			return fmt.Errorf("%s %q: %w", flag, addr, err)
		}
	}
	return agentapi.Check(cfg.Datapath.Layout().Socket())
}

// checkListenAddr accepts "" (off) and host:port with an IP or no host and
// a port from 1 to 65535 (0 would pick one nobody scrapes).
func checkListenAddr(addr string) error {
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host != "" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Errorf("the host must be an IP address: %w", err)
		}
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return nil
}

// check validates the configuration and the node; nothing changes on the
// host.
func check(cfg Config) (*agent, error) {
	if err := ValidateConfig(cfg); err != nil {
		return nil, err
	}
	if cfg.LockWait <= 0 {
		cfg.LockWait = 60 * time.Second
	}
	a := &agent{}
	if cfg.Kubernetes != nil {
		var err error
		if a.pods, err = newPodScope(*cfg.Kubernetes); err != nil {
			return nil, err
		}
		cfg.Cgroups = []string{a.pods.root}
		cfg.Datapath.CgroupFilter = true
	}
	if v := os.Getenv(testScopeEnv); v != "" && cfg.Kubernetes == nil {
		a.testScope = strings.Split(v, ",")
		cfg.Datapath.CgroupFilter = true
	}
	if len(cfg.Cgroups) == 0 {
		root, err := cgroupv2.Root()
		if err != nil {
			return nil, err
		}
		cfg.Cgroups = []string{root}
	}
	for _, cg := range cfg.Cgroups {
		if err := cgroupv2.Validate(cg); err != nil {
			return nil, err
		}
	}
	if err := bpfsys.Check(datapath.Requirements()); err != nil {
		return nil, err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	// The families' checks (the bypass's nf_conntrack_tcp_be_liberal, the
	// load balancer's source) come before anything changes; the datapath
	// loads them.
	for _, o := range cfg.FamilyOptions() {
		if err := o.CheckNode(); err != nil {
			return nil, err
		}
	}
	a.cfg = cfg
	return a, nil
}

// listen takes the health and metrics addresses and serves health.
func (a *agent) listen(ctx context.Context) error {
	hl, err := listenHealth(a.cfg.HealthAddr)
	if err != nil {
		return err
	}
	a.hl = hl
	a.parts.addFunc(hl.close)
	if a.msrv, err = listenMetrics(a.cfg.MetricsAddr); err != nil {
		return err
	}
	if a.msrv != nil {
		a.parts.addFunc(func() { a.msrv.Close() }) // the address, if never served
	}
	a.parts.addFunc(hl.serve(ctx))
	return nil
}

// install installs (or adopts) the pinned datapath on the managed cgroups:
// every family asked for, in one transaction (datapath.Install), which also
// removes the families an earlier agent pinned and this one is not told to
// run.
func (a *agent) install(context.Context) error {
	cfg := &a.cfg
	cfg.Datapath.Families.Services = cfg.Services.On
	dp, err := datapath.Install(cfg.Datapath, cfg.Cgroups)
	if err != nil {
		return err
	}
	a.dp = dp
	a.parts.add(dp.Close)
	if pruned := dp.Pruned(); len(pruned) > 0 {
		slog.Info("detached cgroups no longer managed (or removed)", "cgroup_ids", pruned)
	}
	if n, ok := dp.Removed()["bypass"]; ok {
		slog.Info("removed the bridge bypass an earlier agent pinned", "links", n)
	}
	if n, ok := dp.Removed()["services"]; ok {
		slog.Info("removed the Service load balancer an earlier agent pinned", "cgroups", n)
	}
	if bp := &cfg.Datapath.Families.Bypass; bp.On && dp.Bypass() == nil {
		// A kernel without one of its programs' needs (tcx, a kfunc, a
		// BTF field): the rest runs (docs/kernels.md).
		bp.Refused(dp.OffCode("bypass"), dp.Off("bypass"))
	}
	if !cfg.Datapath.Families.Bypass.On {
		bypass.RemoveManagedNeighbours()
	}
	return nil
}

// families starts the agent's side of the bridge bypass and the Service
// load balancer the datapath runs; plain mode clears a Kubernetes-mode
// selection.
func (a *agent) families(context.Context) error {
	cfg := &a.cfg
	if bp := a.dp.Bypass(); bp != nil {
		bb, err := bypass.NewNode(bp)
		if err != nil {
			return err
		}
		a.bb = bb
		a.addNode(bb)
		if a.pods != nil {
			// The node's pods from the API: managed neighbour entries, so
			// every pod is an endpoint.
			bb.ManageNeighbours()
			a.pods.cfg.PodIPs = bb.SetPods
		}
	}
	if l := a.dp.Services(); l != nil {
		if cfg.Kubernetes != nil { // the pods' cgroups where Kubernetes mode finds them
			cfg.Services.Pods.PodsCgroup, cfg.Services.Pods.Driver = cfg.Kubernetes.PodsCgroup, cfg.Kubernetes.Driver
			cfg.Services.Pods.Cgroup2Root = cfg.Kubernetes.Cgroup2Root
		}
		svc := svcsync.NewNode(cfg.Services, l)
		if a.pods != nil {
			svc.SetPodWatch(a.pods.watch)
		}
		a.svc = svc
		a.addNode(svc)
	}
	if a.pods == nil {
		// Plain mode selects whole subtrees: a selection left by a
		// Kubernetes-mode agent means nothing now.
		ids, err := cgroupIDs(a.testScope)
		if err != nil {
			return fmt.Errorf("%s: %w", testScopeEnv, err)
		}
		if _, n, err := a.dp.SetScope(ids); err != nil {
			return err
		} else if n > 0 {
			slog.Info("cleared the pod selection of an earlier Kubernetes-mode agent", "cgroups", n)
		}
	}
	return nil
}

// converge reports the parts, serves metrics, and starts what keeps the
// families converged: the pods' devices, the Service load balancer's
// sources.
func (a *agent) converge(ctx context.Context) error {
	a.rep = partsReport(a.dp)
	logParts(a.rep)
	if err := a.rep.Write(a.cfg.Datapath.Layout().Report()); err != nil {
		slog.Warn("cannot write the parts report `eztunnel status` reads", "err", err)
	}
	stopMetrics, err := serveMetrics(ctx, a.msrv, a.dp, a.cfg.Version, a.pods, a.nodes, a.rep)
	if err != nil {
		return err
	}
	a.parts.addFunc(stopMetrics)
	if a.bb != nil {
		a.bb.SetReporter(bypassReporter(a.rep, a.cfg.Datapath.Layout().Report()))
	}
	// The namespaces whose devices carry the RST on close: those of the
	// managed cgroups' processes, or with --close-reset-devices=covered in
	// Kubernetes mode, of the selected pods' (each selection rescans).
	cover := func() []string { return a.cfg.Cgroups }
	if a.pods != nil && a.dp.CoveredOnly() {
		cover = a.pods.cgroupPaths
	}
	if a.testScope != nil && a.dp.CoveredOnly() {
		cover = func() []string { return a.testScope }
	}
	stopPods, rescan, err := watchPods(ctx, a.dp, cover, a.bb)
	if err != nil {
		if a.bb != nil {
			err = fmt.Errorf("--bypass: %w", err)
		}
		return err
	}
	a.stopPods = a.parts.addFunc(stopPods)
	if a.pods != nil && a.dp.CoveredOnly() {
		a.pods.applied = rescan
	}
	if a.dp.CoveredOnly() {
		rescan() // at the first poll: until then what the install attached stays
	}
	if a.cfg.Datapath.CoveredOnly && !a.dp.CoveredOnly() {
		slog.Warn("--close-reset-devices=covered is off: the close reset does not run here, so no device carries it and sockets enrol without waiting for it (see the close-reset part)")
	}
	if a.bb != nil {
		a.bb.Prune() // what an earlier agent pinned and the first convergence did not want
		a.bb.LogAttached()
	}
	if a.svc != nil {
		if err := a.svc.Start(ctx, a.cfg.Cgroups); err != nil {
			return err
		}
	}
	if err := a.serveAPI(); err != nil {
		return err
	}
	a.hl.setCheck(notReady(a.nodes))
	// Loading parsed the kernel's BTF (tens of MB, partly mmapped); nothing
	// needs it any more: give it back before serving for months.
	runtime.GC()
	debug.FreeOSMemory()
	slog.Info("datapath attached", "cgroups", a.cfg.Cgroups, "pins", a.cfg.Datapath.Dir(), "kubernetes", a.pods != nil)
	return nil
}

// addNode runs a family's node side: stopped with the agent's parts, or
// before by stopFamilies.
func (a *agent) addNode(n familyNode) {
	a.nodes = append(a.nodes, n)
	a.parts.addFunc(n.Close)
}

// stopFamilies stops, before the datapath is closed or uninstalled, what
// converges the families and the families' handles (pinned, they keep
// working): after a handover or the DaemonSet's removal.
func (a *agent) stopFamilies() {
	if a.stopPods != nil {
		a.stopPods()
	}
	for _, n := range a.nodes {
		n.Close()
	}
}

// serve is the agent's loop: readiness, adoption rounds, the Kubernetes
// side's events, handovers, and the periodic work (cgroups, released
// connections, pair aging), until ctx ends.
func (a *agent) serve(ctx context.Context) error {
	cfg, dp, hl := a.cfg, a.dp, a.hl
	ev := kubeEvents{synced: closedChan()}
	kctx, cancelKube := context.WithCancel(ctx)
	stopKube := a.parts.addFunc(cancelKube)
	if a.pods != nil {
		var err error
		if ev, err = a.pods.start(kctx, dp); err != nil {
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
	ad := newAdopter(cfg, dp, a.rep)
	a.parts.addFunc(ad.stop) // before the datapath closes

	tick := time.NewTicker(cfg.PairMaxAge / 4)
	defer tick.Stop()
	var full mapFullLog
	full.check(dp) // from the counters pinned now: a restart does not repeat an old warning
	var backoff releaseBackoff
	release := time.NewTimer(backoff.next(true))
	defer release.Stop()
	reconcile := time.NewTicker(reconcileEvery)
	defer reconcile.Stop()
	for {
		hl.tick()
		select {
		case <-ctx.Done():
			// SIGTERM may come before the watch tells that the DaemonSet
			// went (helm uninstall deletes it and its pods at once): ask the
			// API before leaving the datapath behind.
			if ev.removal != nil {
				if gone, who := removalConfirmed(ev.removal, a.lock, "SIGTERM"); gone {
					return a.uninstall(ctx, stopKube, ad)
				} else if who != "" {
					a.handOver(stopKube, who)
					return nil
				}
			}
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
				ad.round("start")
			}
		case <-adoptNow:
			if synced == nil {
				ad.round("request")
			}
		case <-adoptTick:
			if synced == nil {
				ad.round("interval")
			}
		case err := <-ev.failed:
			return fmt.Errorf("watching the node's pods: %w", err)
		case <-ev.removed:
			// Our DaemonSet looks gone. Confirmed after a pause (no
			// DaemonSet of the same name, no new agent asking for the node),
			// this is `helm uninstall`, not an update or a replacement.
			ev.removed = nil
			gone, who := removalConfirmed(ev.removal, a.lock, "the watch")
			if who != "" {
				a.handOver(stopKube, who)
				<-ctx.Done()
				return nil
			}
			if gone {
				return a.uninstall(ctx, stopKube, ad)
			}
		case who := <-a.lock.Requested():
			a.handOver(stopKube, who)
			<-ctx.Done()
			return nil
		case <-reconcile.C:
			a.reconcileCgroups()
		case <-release.C:
			busy, err := dp.ReleaseSwitched()
			if err != nil {
				slog.Warn("releasing switched connections", "err", err)
			}
			release.Reset(backoff.next(busy))
		case <-tick.C:
			a.agePairs(&full)
		}
	}
}

// reconcileCgroups attaches to the configured cgroups that appeared and
// detaches from those gone. In Kubernetes mode the pods' root stays and
// pods converge through the selection instead.
func (a *agent) reconcileCgroups() {
	if a.pods != nil {
		return
	}
	attached, missing, pruned, err := a.dp.ReconcileCgroups(a.cfg.Cgroups)
	if err != nil {
		slog.Warn("reconciling cgroups", "err", err)
	}
	if len(attached)+len(pruned) > 0 {
		slog.Info("cgroups reconciled", "attached", attached, "detached_ids", pruned, "missing", missing)
	}
}

// agePairs removes pairing records older than --pair-max-age, then warns
// if connections fell back for a full map since the last tick.
func (a *agent) agePairs(full *mapFullLog) {
	if n, err := a.dp.AgePairs(a.cfg.PairMaxAge); err != nil {
		slog.Warn("aging pairing records", "err", err)
	} else if n > 0 {
		slog.Info("aged out pairing records", "count", n)
	}
	full.check(a.dp)
}

// mapFullLog warns when connections fell back because a datapath map was
// full (fallback_map_full grew), or when a map of handshakes in flight
// (LRU: pairs, aliases, SYN index) reached its bound and evicts the oldest
// handshakes' entries (a SYN scan, or more connections in setup than
// --max-pairs: an evicted handshake that had not paired yet takes the
// kernel path), at most once per aging tick and once per episode.
type mapFullLog struct {
	primed  bool
	last    uint64
	atBound bool
}

// lruSlack is how far below its bound an LRU map may start to evict: each
// other CPU may hold up to LOCAL_FREE_TARGET (128) free nodes in its local
// list (kernel/bpf/bpf_lru_list.c, bpf_lru_list_pop_free_to_local shrinks
// once the global free list is empty).
func lruSlack(max uint32) int { return min(int(max)/2, 128*(runtime.NumCPU()-1)) }

func (m *mapFullLog) check(dp *datapath.Datapath) {
	c, err := dp.Counters()
	if err != nil {
		return
	}
	n := c["fallback_map_full"]
	if m.primed && n > m.last {
		slog.Warn("datapath maps full: new connections take the kernel path (counted as fallback_map_full; see eztunnel_map_entries, --max-pairs, --max-sockets)",
			"fallbacks", n-m.last)
	}
	m.primed, m.last = true, n
	fill, err := dp.PairingFill()
	if err != nil {
		return
	}
	var full []string
	for name, f := range fill {
		if f.Entries >= int(f.MaxEntries)-lruSlack(f.MaxEntries) {
			full = append(full, name)
		}
	}
	if len(full) > 0 && !m.atBound {
		slices.Sort(full)
		slog.Warn("datapath maps full: handshake maps at their bound evict the oldest handshakes' entries (LRU); a handshake evicted before it paired takes the kernel path (see eztunnel_map_entries, --max-pairs)",
			"maps", full)
	}
	m.atBound = len(full) > 0
}

func closedChan() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// uninstall drains and removes the datapath: the agent's DaemonSet is gone.
func (a *agent) uninstall(ctx context.Context, stopKube func() error, ad *adopter) error {
	stopKube()
	a.hl.setReady(false, "uninstalling: the agent's DaemonSet was deleted")
	ad.stop() // no round while the datapath is drained
	a.stopFamilies()
	return uninstallOnRemoval(ctx, a.dp, a.cfg, a.lock)
}

// handOver gives the datapath to the agent who asked for the node's lock.
func (a *agent) handOver(stopKube func() error, who string) {
	// Everything the next agent needs goes before the lock: our
	// hold on the datapath, and the health and metrics ports.
	stopKube()
	a.hl.setReady(false, "handed over to "+who)
	slog.Info("handing the datapath over; standing by until stopped (the datapath stays pinned)", "to", who)
	// Every part, the lock last (the round in progress ends before
	// the datapath closes; the bypass and the load balancer stay
	// pinned: the next agent updates them in place).
	if err := a.parts.stop(); err != nil {
		slog.Warn("stopping the agent's parts", "err", err)
	}
}

// removalSettle is how long an agent whose DaemonSet looks removed waits for
// a replacement (a DaemonSet of the same name: replace --force, delete
// --cascade=orphan then create, helm upgrade --force; or the next agent
// asking for the node's lock) before it re-reads the DaemonSet and decides.
var removalSettle = 5 * time.Second

// removalConfirmed re-reads the agent's DaemonSet: gone is true only when it
// is not found or ours is marked for deletion, twice, removalSettle apart,
// and no agent asked for the node's lock meanwhile (who: the caller hands
// over). A replacement, the DaemonSet still there, or an API error keep the
// datapath: a node is never uninstalled on a guess.
func removalConfirmed(rm *kube.Removal, lock *agentlock.Lock, after string) (gone bool, who string) {
	check := func() bool {
		// Short: the run loop (and /healthz) waits meanwhile.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		gone, how, err := rm.Check(ctx)
		if err != nil {
			slog.Warn("kubernetes: cannot re-read the agent's DaemonSet: keeping the datapath", "after", after, "err", err)
			return false
		}
		slog.Info("kubernetes: the agent's DaemonSet re-read", "after", after, "found", how, "removed", gone)
		return gone
	}
	if !check() {
		return false, ""
	}
	t := time.NewTimer(removalSettle)
	defer t.Stop()
	select {
	case who := <-lock.Requested():
		slog.Info("kubernetes: the agent's DaemonSet looked removed, but a new agent asked for the node: handing over, not uninstalling", "after", after, "to", who)
		return false, who
	case <-t.C:
	}
	return check(), ""
}

// cgroupIDs are the ids of the cgroups at paths.
func cgroupIDs(paths []string) ([]uint64, error) {
	var ids []uint64
	for _, p := range paths {
		id, err := cgroupv2.ID(p)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}
