package e2e

import (
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// TestChurnMapsReturnToStart opens and closes 200k short connections; the
// pairing records and the sockhash must be back to their starting size.
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
	entries := func() (int, int) {
		s, err := datapath.Entries(pinned.Sockets)
		if err != nil {
			t.Fatal(err)
		}
		p, err := datapath.Entries(pinned.Pairs)
		if err != nil {
			t.Fatal(err)
		}
		a, err := datapath.Entries(pinned.Aliases)
		if err != nil {
			t.Fatal(err)
		}
		u, err := datapath.Entries(pinned.Unreads)
		if err != nil {
			t.Fatal(err)
		}
		return s, p + a + u
	}
	s0, p0 := entries()
	const conns = 200000
	start := time.Now()
	d := e.streamCounted(a, streamCase{conns: conns, parallel: 32, up: 16, down: 16, chunk: 16}, hostport(b.IPv4, 7000), 7)
	t.Logf("%d connections in %s: %v", conns, time.Since(start).Round(time.Millisecond), d)
	requirePaired(t, d, conns, 1, "churn")
	// Closing is asynchronous to the client's exit (the server closes after
	// its trailer); give the last sockets a moment to go.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, p := entries()
		if s == s0 && p == p0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("maps did not return to start: sockets %d (start %d), pairs+aliases+unread %d (start %d)", s, s0, p, p0)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
