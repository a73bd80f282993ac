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
func watchDevices(ctx context.Context, dp *datapath.Datapath) (stop func(), err error) {
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
	return func() {
		cancel()
		mu.Lock()
		stopped = true
		mu.Unlock()
	}, nil
}
