package shortcut

import (
	"testing"
	"time"
)

// TestPruneIndex: the index entries older than the age whose connection
// has no unread record (a client's under its own cookie, a server's under
// its peer's) are deleted, over several batches of both maps; paired ends
// and young entries stay.
func TestPruneIndex(t *testing.T) {
	const (
		conns  = 2 * entryBatch
		maxAge = time.Minute
		now    = uint64(10 * time.Hour)
	)
	index, unreads := indexMaps(t, conns)
	old, young := now-uint64(2*maxAge), now-uint64(maxAge/2)
	want := map[uint64]bool{} // the entries that stay
	for i := range uint64(conns) {
		client, server := 2*i+2, 2*i+3
		created := old
		if i%3 == 2 {
			created = young
		}
		paired := i%2 == 0
		if err := index.Put(client, shortcutEzConnIndex{CreatedNs: created, Flags: uint32(shortcutEzSockFlagsEZ_F_CLIENT)}); err != nil {
			t.Fatal(err)
		}
		if err := index.Put(server, shortcutEzConnIndex{CreatedNs: created, PeerCookie: client, Flags: uint32(shortcutEzSockFlagsEZ_F_SERVER)}); err != nil {
			t.Fatal(err)
		}
		if paired {
			if err := unreads.Put(client, shortcutEzUnread{Refs: 2}); err != nil {
				t.Fatal(err)
			}
		}
		if paired || created == young {
			want[client], want[server] = true, true
		}
	}
	n, err := pruneIndex(index, unreads, now, maxAge)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2*conns-len(want) || n == 0 {
		t.Fatalf("%d pruned, want %d", n, 2*conns-len(want))
	}
	left := 0
	var ix shortcutEzConnIndex
	for cookie := range uint64(2*conns + 2) {
		err := index.Lookup(cookie, &ix)
		if (err == nil) != want[cookie] {
			t.Fatalf("end %d: lookup %v, want kept %v", cookie, err, want[cookie])
		}
		if err == nil {
			left++
		}
	}
	if left != len(want) {
		t.Fatalf("%d entries left, want %d", left, len(want))
	}
	// Nothing more to prune.
	if n, err := pruneIndex(index, unreads, now, maxAge); err != nil || n != 0 {
		t.Fatalf("second prune: %d, %v", n, err)
	}
}
