package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// podsResync is the backstop full scan of the pods' veths, addresses and
// the uplinks, besides netlink updates; loopbackEvery is how often the pods'
// namespaces are visited (netlink does not announce them).
const (
	podsResync    = 5 * time.Second
	loopbackEvery = 10 * time.Second
	// coveragePoll is how often the namespaces sockops asked for are read
	// (shortcut.CoverageWanted): a pod's loopback gets the RST on close
	// within about this much after its first handshake.
	coveragePoll = 100 * time.Millisecond
)

// loopbackScanEnv sets the full scan's period (a Go duration) instead of
// loopbackEvery: tests set it long to prove that a namespace's first
// handshake alone gets its loopback attached. Never set it in production.
const loopbackScanEnv = "EZTUNNEL_TEST_LOOPBACK_SCAN"

// loopbackScan is the full scan's period: loopbackEvery, or what
// loopbackScanEnv says.
func loopbackScan() time.Duration {
	if d, err := time.ParseDuration(os.Getenv(loopbackScanEnv)); err == nil && d > 0 {
		return d
	}
	return loopbackEvery
}

// loopbacks attaches the RST on close to the pods' loopbacks: at every full
// scan of the managed cgroups' processes (every), and between scans as soon
// as sockops asks for a namespace (its first handshake found it
// uncovered). A namespace asked for that a scan did not cover (its
// processes gone, or one the agent may not enter) is not scanned for again
// until the next full scan, and scans asked for start at least nine
// times the last scan's duration after it ended: a workload that makes new
// namespaces cannot make the agent scan in a loop, nor spend more than
// about a tenth of a CPU on it.
type loopbacks struct {
	dp      loopbackSyncer
	cgroups func() []string // whose processes' namespaces are covered
	every   time.Duration
	last    time.Time       // the last full scan
	failed  map[uint64]bool // asked for since the last full scan
	ended   time.Time       // the end of the last scan
	took    time.Duration   // how long it took
	warned  bool
	rescan  bool             // a full scan is due (the cgroups changed), within the pace of asked scans
	now     func() time.Time // time.Now; tests set their own clock
}

// loopbackSyncer is what loopbacks needs of the datapath.
type loopbackSyncer interface {
	CoverageWanted() ([]uint64, error)
	SyncLoopbacks(cgroups []string) (denied int, err error)
}

// tick runs a full scan when it is due, else one for the namespaces asked
// for that are not in failed.
func (l *loopbacks) tick() {
	var asked []uint64
	if l.now().Sub(l.last) >= l.every || (l.rescan && l.now().Sub(l.ended) >= 9*l.took) {
		l.rescan = false
		l.last = l.now()
		clear(l.failed)
	} else {
		if l.now().Sub(l.ended) < 9*l.took {
			return // the requests wait in ez_sc_netns_wanted
		}
		wanted, err := l.dp.CoverageWanted()
		if err != nil {
			slog.Warn("RST on close: namespaces asked for (retried)", "err", err)
		}
		for _, c := range wanted {
			if !l.failed[c] {
				asked = append(asked, c)
			}
		}
		if len(asked) == 0 {
			return
		}
	}
	for _, c := range asked {
		l.failed[c] = true // covered now, or not to be scanned for again before the next full scan
	}
	start := l.now()
	denied, err := l.dp.SyncLoopbacks(l.cgroups())
	l.ended = l.now()
	l.took = l.ended.Sub(start)
	if err != nil {
		slog.Warn("RST on close: pod loopbacks (retried)", "err", err)
	}
	if denied > 0 && !l.warned {
		l.warned = true
		slog.Warn("RST on close: cannot open the network namespace of some processes of the managed cgroups (it needs CAP_SYS_ADMIN, CAP_SYS_PTRACE and the host PID namespace): a FIN over their pod's own loopback stays a FIN", "processes", denied)
	}
}

// watchPods keeps what follows the node's pods converged with one podnet
// watch until the returned stop is called: the RST-on-close device links
// (the loopback device and the pods' veths of the agent's network
// namespace, then the pods' own loopbacks, of the namespaces where the
// processes of cover's cgroups live) and, with --bypass (bb not nil), the
// bypass's veths, uplinks and endpoints. stop waits for a sync in progress,
// so the datapath may be closed after it; the bypass is closed on its own
// (bb.Close), after which its Apply does nothing. rescan makes the next
// poll a full scan (what cover returns changed).
func watchPods(ctx context.Context, dp *datapath.Datapath, cover func() []string, bb *bypass.Node) (stop, rescan func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	stopped := false
	err = podnet.Watch(ctx, podsResync, func(st podnet.State) {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if err := dp.SyncDevices(st); err != nil {
			slog.Warn("RST on close: devices (retried at the next change or resync)", "err", err)
		}
		if bb != nil {
			bb.Apply(st)
			bb.SyncNeighbours(st)
		}
	})
	if err != nil {
		cancel()
		return nil, nil, fmt.Errorf("discover the pods' devices: %w", err)
	}
	// The pods' own loopback devices: their namespaces come from the
	// managed cgroups' processes (netlink does not announce them).
	lb := &loopbacks{dp: dp, cgroups: cover, every: loopbackScan(), last: time.Now(), failed: map[uint64]bool{}, now: time.Now}
	go func() {
		t := time.NewTicker(coveragePoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mu.Lock()
			if !stopped {
				lb.tick()
			}
			mu.Unlock()
		}
	}()
	stop = func() {
		cancel()
		mu.Lock()
		stopped = true
		mu.Unlock()
	}
	rescan = func() {
		mu.Lock()
		lb.rescan = true
		mu.Unlock()
	}
	return stop, rescan, nil
}
