package agent

import (
	"testing"
	"time"
)

// fakeSyncer is the datapath as loopbacks sees it: the namespaces asked
// for, and a count of scans, each of which takes took on clock.
type fakeSyncer struct {
	wanted []uint64
	scans  int
	took   time.Duration
	clock  *time.Time
}

func (f *fakeSyncer) CoverageWanted() ([]uint64, error) {
	w := f.wanted
	f.wanted = nil
	return w, nil
}

func (f *fakeSyncer) SyncLoopbacks([]string) (int, error) {
	f.scans++
	*f.clock = f.clock.Add(f.took)
	return 0, nil
}

// TestLoopbacksTick: a namespace asked for gets a scan at once; asked again
// (the scan did not cover it) it waits for the next full scan; a new one
// waits until nine times the last scan's duration have passed; the full
// scan runs when due and forgets what failed, and so does a rescan (a new
// selection), at the pace of asked scans.
func TestLoopbacksTick(t *testing.T) {
	clock := time.Unix(1000, 0)
	f := &fakeSyncer{took: time.Millisecond, clock: &clock}
	l := &loopbacks{dp: f, cgroups: func() []string { return nil }, every: time.Hour, last: clock, failed: map[uint64]bool{}, now: func() time.Time { return clock }}
	step := func(d time.Duration, wanted ...uint64) {
		clock = clock.Add(d)
		f.wanted = wanted
		l.tick()
	}
	check := func(what string, scans int) {
		t.Helper()
		if f.scans != scans {
			t.Errorf("%s: %d scans, want %d", what, f.scans, scans)
		}
	}
	step(coveragePoll)
	check("nothing asked for", 0)
	step(coveragePoll, 7)
	check("namespace 7 asked for", 1)
	step(coveragePoll, 7)
	check("7 asked for again before the full scan", 1)
	f.took = 20 * time.Millisecond
	step(coveragePoll, 8)
	check("namespace 8 asked for", 2)
	step(coveragePoll, 9) // 100 ms after a 20 ms scan: under 180 ms
	check("9 asked for within nine times the last scan", 2)
	if len(f.wanted) != 1 {
		t.Errorf("9's request was taken (%v left), want it kept in the map", f.wanted)
	}
	step(coveragePoll, f.wanted...)
	check("9 asked for after nine times the last scan", 3)
	step(time.Hour)
	check("the full scan due", 4)
	if len(l.failed) != 0 {
		t.Errorf("failed after the full scan: %v, want none", l.failed)
	}
	step(time.Second, 7)
	check("7 asked for after the full scan", 5)
	// A new selection (rescan): a full scan, at the pace of asked ones.
	l.rescan = true
	step(coveragePoll)
	check("rescan within nine times the last scan", 5)
	step(coveragePoll)
	check("rescan after nine times the last scan", 6)
	if len(l.failed) != 0 || l.rescan {
		t.Errorf("after the rescan: failed %v, rescan %v; want none, false", l.failed, l.rescan)
	}
}
