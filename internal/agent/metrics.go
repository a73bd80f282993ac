package agent

import (
	"context"
	"log/slog"
	"sync"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	"github.com/eztunnel/eztunnel/internal/metrics"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// listenMetrics binds --metrics-addr (nothing when empty) before the agent
// changes anything, so a taken address is reported first.
func listenMetrics(addr string) (*metrics.Server, error) {
	if addr == "" {
		return nil, nil
	}
	return metrics.Listen(addr)
}

// serveMetrics serves the pinned datapath's metrics, and those of the
// families' node sides, on srv until ctx is done.
// The returned function stops the server and releases the maps.
func serveMetrics(ctx context.Context, srv *metrics.Server, dp *datapath.Datapath, version string, pods *podScope, nodes []familyNode, rep parts.Report) (func(), error) {
	if srv == nil {
		return func() {}, nil
	}
	p, err := datapath.OpenPinned(dp.Config())
	if err != nil {
		srv.Close()
		return nil, err
	}
	// Scrapes read the map fill the last walk found (metrics.FillInterval).
	fill := metrics.NewFillCache(p.ReadFill, metrics.FillInterval)
	fill.Refresh()
	reg := metrics.Registry(metrics.NewCollector(metrics.CachedFill{Source: p, Fill: fill}, version))
	reg.MustRegister(fill.Collector())
	if pods != nil {
		reg.MustRegister(metrics.NewPodCollector(podMetrics{pods, p}))
	}
	reg.MustRegister(bypass.Enabled(dp.OffCode("bypass")))
	reg.MustRegister(metrics.FeatureEnabled(rep))
	for _, n := range nodes {
		reg.MustRegister(n.Collectors()...)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		walks := make(chan struct{})
		go func() { defer close(walks); fill.Run(ctx) }()
		defer func() { <-walks }() // the maps are closed after the last walk
		if err := srv.Serve(ctx, reg); err != nil {
			slog.Error("metrics server stopped", "err", err)
		}
	}()
	slog.Info("serving metrics", "addr", srv.Addr().String(), "path", "/metrics")
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done; p.Close() }) }, nil
}

// podMetrics joins the agent's pod selection and the pinned per-cgroup counts.
type podMetrics struct {
	*podScope
	pinned *datapath.Pinned
}

func (m podMetrics) ReadScope() (map[uint64]uint64, error) { return m.pinned.ReadScope() }
