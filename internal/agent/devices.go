package agent

import (
	"context"
	"fmt"
	"log/slog"
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
)

// watchPods keeps what follows the node's pods converged with one podnet
// watch until the returned stop is called: the RST-on-close device links
// (the loopback device and the pods' veths of the agent's network
// namespace, then the pods' own loopbacks) and, with --bypass (bb not nil),
// the bypass's veths, uplinks and endpoints. stop waits for a sync in
// progress, so the datapath may be closed after it; the bypass is closed on
// its own (bb.Close), after which its Apply does nothing.
func watchPods(ctx context.Context, dp *datapath.Datapath, cgroups []string, bb *bypass.Node) (stop func(), err error) {
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
		return nil, fmt.Errorf("discover the pods' devices: %w", err)
	}
	// The pods' own loopback devices: their namespaces come from the
	// managed cgroups' processes (netlink does not announce them).
	go func() {
		t := time.NewTicker(loopbackEvery)
		defer t.Stop()
		warned := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mu.Lock()
			if !stopped {
				denied, err := dp.SyncLoopbacks(cgroups)
				if err != nil {
					slog.Warn("RST on close: pod loopbacks (retried)", "err", err)
				}
				if denied > 0 && !warned {
					warned = true
					slog.Warn("RST on close: cannot open the network namespace of some processes of the managed cgroups (it needs CAP_SYS_ADMIN, CAP_SYS_PTRACE and the host PID namespace): a FIN over their pod's own loopback stays a FIN", "processes", denied)
				}
			}
			mu.Unlock()
		}
	}()
	return func() {
		cancel()
		mu.Lock()
		stopped = true
		mu.Unlock()
	}, nil
}
