package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// devicesResync is the backstop full scan of the devices the RST on close
// is attached to, besides netlink updates.
const devicesResync = 10 * time.Second

// watchDevices keeps the RST-on-close device links (the loopback device and
// the pods' veths of the agent's network namespace) converged with netlink
// until the returned stop is called; stop waits for a sync in progress, so
// the datapath may be closed after it.
func watchDevices(ctx context.Context, dp *datapath.Datapath, cgroups []string) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	stopped := false
	err = podnet.Watch(ctx, devicesResync, func(st podnet.State) {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if err := dp.SyncDevices(st); err != nil {
			slog.Warn("RST on close: devices (retried at the next change or resync)", "err", err)
		}
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("discover devices for the RST on close: %w", err)
	}
	// The pods' own loopback devices: their namespaces come from the
	// managed cgroups' processes (netlink does not announce them).
	go func() {
		t := time.NewTicker(devicesResync)
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
