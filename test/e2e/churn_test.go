package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

// TestChurnMapsReturnToStart opens and closes 100k short connections; the
// pairing records, the connection index and the sockhash must be back to
// their starting size.
func TestChurnMapsReturnToStart(t *testing.T) {
	e := newEnv(t, "churn", 18)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000")
	e.accelerate()
	pinned, err := datapath.OpenPinned(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if pinned.Index == nil {
		t.Fatal("no connection index pinned")
	}
	count := func(m *ebpf.Map) int {
		n, err := shortcut.Entries(m)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	entries := func() (int, int) {
		return count(pinned.Sockets), count(pinned.Pairs) + count(pinned.Aliases) + count(pinned.Unreads) + count(pinned.Index)
	}
	s0, p0 := entries()
	const conns = 100000
	start := time.Now()
	d := e.streamCounted(a, streamCase{conns: conns, parallel: 32, up: 16, down: 16, chunk: 16}, hostport(b.IPv4, 7000), 7)
	t.Logf("%d connections in %s: %v", conns, time.Since(start).Round(time.Millisecond), d)
	requirePaired(t, d, conns, 1, "churn")
	// Closing is asynchronous to the client's exit (the server closes after
	// its trailer); give the last sockets a moment to go.
	deadline := time.Now().Add(scaled(10 * time.Second))
	for {
		s, p := entries()
		if s == s0 && p == p0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("maps did not return to start: sockets %d (start %d), pairs+aliases+unread+index %d (start %d)", s, s0, p, p0)
			for name, m := range map[string]*ebpf.Map{"pairs": pinned.Pairs, "aliases": pinned.Aliases, "unread": pinned.Unreads, "index": pinned.Index} {
				t.Logf("%s: %s", name, dumpMap(m))
			}
			t.Logf("counters now: %v", e.counters())
			t.FailNow()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// dumpMap prints a map's entries as hex, key=value, for a failure message.
func dumpMap(m *ebpf.Map) string {
	var b strings.Builder
	key, val := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&key, &val) {
		fmt.Fprintf(&b, "\n  %x = %x", key, val)
	}
	if err := it.Err(); err != nil {
		fmt.Fprintf(&b, "\n  walk: %v", err)
	}
	if b.Len() == 0 {
		return "empty"
	}
	return b.String()
}
