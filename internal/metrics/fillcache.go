package metrics

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// FillInterval is how often the agent walks the datapath maps to count their
// entries, at most. A walk reads every live entry (a batch lookup a 4,096
// entries of the hash maps, a syscall a key of the sockhash), so scrapes
// never walk: they read the last walk's result (FillCache).
const FillInterval = 30 * time.Second

// WalkCPUShare bounds the walks' CPU: the next walk waits at least
// WalkCPUShare times the CPU time the last one took (FillInterval when
// that is longer), so the walks never take more than 1/WalkCPUShare of a
// CPU however many connections the maps hold.
const WalkCPUShare = 20

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
	cpu  time.Duration // the walk's thread's CPU time, user and system
}

// NewFillCache caches read, walked every interval once Refresh or Run is called.
func NewFillCache(read func() (map[string]datapath.MapFill, error), interval time.Duration) *FillCache {
	return &FillCache{read: read, interval: interval}
}

// Refresh walks the maps now, on one OS thread so that the thread's CPU
// time is the walk's (its syscalls run on it).
func (c *FillCache) Refresh() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, cpu0 := time.Now(), CPUTime(unix.RUSAGE_THREAD)
	fill, err := c.read()
	cpu := CPUTime(unix.RUSAGE_THREAD) - cpu0
	c.mu.Lock()
	c.fill, c.err, c.at, c.walk, c.cpu = fill, err, time.Now(), time.Since(start), cpu
	c.mu.Unlock()
}

// CPUTime is the CPU time, user and system, of who (unix.RUSAGE_THREAD:
// the calling thread; unix.RUSAGE_SELF: the process), 0 where getrusage
// fails.
func CPUTime(who int) time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(who, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Wait is how long after the last walk the next one starts: the interval,
// or WalkCPUShare times the last walk's CPU time when that is longer.
func (c *FillCache) Wait() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.interval, WalkCPUShare*c.cpu)
}

// Run refreshes the fill, each walk Wait after the last, until ctx is done;
// it returns after the last walk ended, so the maps can be closed then.
func (c *FillCache) Run(ctx context.Context) {
	t := time.NewTimer(c.Wait())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Refresh()
			t.Reset(c.Wait())
		}
	}
}

// ReadFill returns the last walk's result (its error too).
func (c *FillCache) ReadFill() (map[string]datapath.MapFill, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fill, c.err
}

// Collector exports when the fill was last walked, how long it took and
// the CPU time it used.
func (c *FillCache) Collector() prometheus.Collector { return fillCacheCollector{c} }

type fillCacheCollector struct{ c *FillCache }

var (
	fillAgeDesc = prometheus.NewDesc(namespace+"_map_fill_age_seconds",
		"Age of eztunnel_map_entries: the maps are walked every "+FillInterval.String()+", or "+fmt.Sprint(WalkCPUShare)+
			" times the last walk's CPU time when longer, not at each scrape.", nil, nil)
	fillWalkDesc = prometheus.NewDesc(namespace+"_map_fill_walk_seconds",
		"Wall time of the last walk of the datapath maps that counted their entries.", nil, nil)
	fillWalkCPUDesc = prometheus.NewDesc(namespace+"_map_fill_walk_cpu_seconds",
		"CPU time (user and system) of the last walk of the datapath maps that counted their entries; the next walk waits at least "+
			fmt.Sprint(WalkCPUShare)+" times as long.", nil, nil)
)

func (f fillCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fillAgeDesc
	ch <- fillWalkDesc
	ch <- fillWalkCPUDesc
}

func (f fillCacheCollector) Collect(ch chan<- prometheus.Metric) {
	f.c.mu.Lock()
	at, walk, cpu := f.c.at, f.c.walk, f.c.cpu
	f.c.mu.Unlock()
	if at.IsZero() {
		return
	}
	ch <- prometheus.MustNewConstMetric(fillAgeDesc, prometheus.GaugeValue, time.Since(at).Seconds())
	ch <- prometheus.MustNewConstMetric(fillWalkDesc, prometheus.GaugeValue, walk.Seconds())
	ch <- prometheus.MustNewConstMetric(fillWalkCPUDesc, prometheus.GaugeValue, cpu.Seconds())
}

// CachedFill is src with its ReadFill served by a FillCache.
type CachedFill struct {
	Source
	Fill *FillCache
}

// ReadFill implements Source.
func (s CachedFill) ReadFill() (map[string]datapath.MapFill, error) { return s.Fill.ReadFill() }
