package metrics

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// slowGatherer holds every gather until release is closed and counts the
// gathers running at once.
type slowGatherer struct {
	release      chan struct{}
	running, max atomic.Int32
}

func (g *slowGatherer) Gather() ([]*dto.MetricFamily, error) {
	n := g.running.Add(1)
	defer g.running.Add(-1)
	for {
		m := g.max.Load()
		if n <= m || g.max.CompareAndSwap(m, n) {
			break
		}
	}
	<-g.release
	return nil, nil
}

// TestServeCapsScrapes: 200 scrapes at once get at most MaxScrapes gathers;
// the rest are answered 503 without waiting.
func TestServeCapsScrapes(t *testing.T) {
	srv, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &slowGatherer{release: make(chan struct{})}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, g) }()
	url := "http://" + srv.Addr().String() + "/metrics"
	var wg sync.WaitGroup
	var mu sync.Mutex
	status := map[string]int{}
	var answered atomic.Int32
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := client.Get(url)
			s := "error"
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				s = strconv.Itoa(resp.StatusCode)
			}
			answered.Add(1)
			mu.Lock()
			status[s]++
			mu.Unlock()
		}()
	}
	// The excess is answered while the capped scrapes still hang.
	deadline := time.Now().Add(30 * time.Second)
	for answered.Load() < 200-MaxScrapes && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(g.release)
	wg.Wait()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if got := g.max.Load(); got > MaxScrapes {
		t.Errorf("%d gathers at once, want at most %d", got, MaxScrapes)
	}
	if status["503"] < 200-MaxScrapes || status["200"] < 1 || status["200"]+status["503"] != 200 {
		t.Errorf("responses %v, want at most %d 200 and the rest 503", status, MaxScrapes)
	}
}

// TestFillCache: scrapes read the last walk; only Refresh walks.
func TestFillCache(t *testing.T) {
	var walks atomic.Int32
	c := NewFillCache(func() (map[string]datapath.MapFill, error) {
		n := walks.Add(1)
		return map[string]datapath.MapFill{"pairs": {Entries: int(n), MaxEntries: 16384}}, nil
	}, time.Hour)
	c.Refresh()
	src := CachedFill{Source: source(), Fill: c}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src, "v"), c.Collector())
	for range 100 {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	if n := walks.Load(); n != 1 {
		t.Fatalf("%d walks for 100 scrapes, want 1", n)
	}
	c.Refresh()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, f := range fams {
		found[f.GetName()] = true
		if f.GetName() == "eztunnel_map_entries" && f.GetMetric()[0].GetGauge().GetValue() != 2 {
			t.Errorf("map entries after the second walk: %v", f.GetMetric())
		}
	}
	for _, name := range []string{"eztunnel_map_entries", "eztunnel_map_fill_age_seconds", "eztunnel_map_fill_walk_seconds", "eztunnel_map_fill_walk_cpu_seconds"} {
		if !found[name] {
			t.Errorf("%s missing", name)
		}
	}
	// Run walks every interval and returns when its context ends.
	c = NewFillCache(func() (map[string]datapath.MapFill, error) { walks.Add(1); return nil, nil }, time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan struct{})
	before := walks.Load()
	go func() { c.Run(ctx); close(ran) }()
	for walks.Load() < before+3 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-ran
}

// TestFillWalkCPU: a walk's CPU time is measured on its thread, exported,
// and spaces the next walk: WalkCPUShare times it when that is longer
// than the interval, the interval otherwise.
func TestFillWalkCPU(t *testing.T) {
	var sink uint64
	c := NewFillCache(func() (map[string]datapath.MapFill, error) {
		// Burn CPU until this thread has used some.
		for start := CPUTime(unix.RUSAGE_THREAD); CPUTime(unix.RUSAGE_THREAD)-start < 20*time.Millisecond; {
			for i := range 100000 {
				sink += uint64(i)
			}
		}
		return nil, nil
	}, time.Millisecond)
	c.Refresh()
	c.mu.Lock()
	cpu := c.cpu
	c.mu.Unlock()
	if cpu < 20*time.Millisecond {
		t.Fatalf("the walk's CPU time %s, want the 20ms it burned at least", cpu)
	}
	if w := c.Wait(); w != WalkCPUShare*cpu {
		t.Fatalf("next walk after %s, want %d times the walk's CPU time %s", w, WalkCPUShare, cpu)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.Collector())
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got float64
	for _, f := range fams {
		if f.GetName() == "eztunnel_map_fill_walk_cpu_seconds" {
			got = f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if got != cpu.Seconds() {
		t.Fatalf("eztunnel_map_fill_walk_cpu_seconds %v, want %v", got, cpu.Seconds())
	}
	idle := NewFillCache(func() (map[string]datapath.MapFill, error) { return nil, nil }, time.Hour)
	idle.Refresh()
	if w := idle.Wait(); w != time.Hour {
		t.Fatalf("a cheap walk: next after %s, want the interval", w)
	}
	_ = sink
}
