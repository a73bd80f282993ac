package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// FillInterval is how often the agent walks the datapath maps to count their
// entries. A walk reads every live entry (about 230k at the default sizes,
// hundreds of milliseconds of CPU when full), so scrapes never walk: they
// read the last walk's result (FillCache).
const FillInterval = 30 * time.Second

// FillCache holds the datapath maps' fill as the last walk found it. Run
// walks every interval; ReadFill returns the result without touching the
// maps, so neither the scrape rate nor concurrent scrapes change how often
// the maps are walked.
type FillCache struct {
	read     func() (map[string]datapath.MapFill, error)
	interval time.Duration

	mu   sync.Mutex
	fill map[string]datapath.MapFill
	err  error
	at   time.Time
	walk time.Duration
}

// NewFillCache caches read, walked every interval once Refresh or Run is called.
func NewFillCache(read func() (map[string]datapath.MapFill, error), interval time.Duration) *FillCache {
	return &FillCache{read: read, interval: interval}
}

// Refresh walks the maps now.
func (c *FillCache) Refresh() {
	start := time.Now()
	fill, err := c.read()
	c.mu.Lock()
	c.fill, c.err, c.at, c.walk = fill, err, time.Now(), time.Since(start)
	c.mu.Unlock()
}

// Run refreshes every interval until ctx is done; it returns after the last
// walk ended, so the maps can be closed then.
func (c *FillCache) Run(ctx context.Context) {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Refresh()
		}
	}
}

// ReadFill returns the last walk's result (its error too).
func (c *FillCache) ReadFill() (map[string]datapath.MapFill, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fill, c.err
}

// Collector exports when the fill was last walked and how long it took.
func (c *FillCache) Collector() prometheus.Collector { return fillCacheCollector{c} }

type fillCacheCollector struct{ c *FillCache }

var (
	fillAgeDesc = prometheus.NewDesc(namespace+"_map_fill_age_seconds",
		"Age of eztunnel_map_entries: the maps are walked every "+FillInterval.String()+", not at each scrape.", nil, nil)
	fillWalkDesc = prometheus.NewDesc(namespace+"_map_fill_walk_seconds",
		"Wall time of the last walk of the datapath maps that counted their entries.", nil, nil)
)

func (f fillCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fillAgeDesc
	ch <- fillWalkDesc
}

func (f fillCacheCollector) Collect(ch chan<- prometheus.Metric) {
	f.c.mu.Lock()
	at, walk := f.c.at, f.c.walk
	f.c.mu.Unlock()
	if at.IsZero() {
		return
	}
	ch <- prometheus.MustNewConstMetric(fillAgeDesc, prometheus.GaugeValue, time.Since(at).Seconds())
	ch <- prometheus.MustNewConstMetric(fillWalkDesc, prometheus.GaugeValue, walk.Seconds())
}

// CachedFill is src with its ReadFill served by a FillCache.
type CachedFill struct {
	Source
	Fill *FillCache
}

// ReadFill implements Source.
func (s CachedFill) ReadFill() (map[string]datapath.MapFill, error) { return s.Fill.ReadFill() }
