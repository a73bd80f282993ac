package shortcut

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
)

// TestEntries: the count of a hash map's and an LRU hash map's entries by
// batch lookups (several batches) and by the keys alone equals what was
// put; an empty sockhash counts 0.
func TestEntries(t *testing.T) {
	for _, c := range []struct {
		typ ebpf.MapType
		n   int
	}{{ebpf.Hash, 3*entryBatch + 17}, {ebpf.LRUHash, 1000}, {ebpf.Hash, 0}} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: c.typ, KeySize: 12, ValueSize: 20, MaxEntries: uint32(4 * entryBatch)})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		key, val := make([]byte, 12), make([]byte, 20)
		for i := range c.n {
			binary.LittleEndian.PutUint64(key, uint64(i)*7919)
			if err := m.Put(key, val); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := Entries(m); err != nil || n != c.n {
			t.Fatalf("%s: Entries %d, %v; want %d", c.typ, n, err, c.n)
		}
		if n, err := batchEntries(m); err != nil || n != c.n {
			t.Fatalf("%s: batches %d, %v; want %d", c.typ, n, err, c.n)
		}
		if n, err := walkKeys(m); err != nil || n != c.n {
			t.Fatalf("%s: keys %d, %v; want %d", c.typ, n, err, c.n)
		}
	}
	sh, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockHash, KeySize: 8, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if n, err := Entries(sh); err != nil || n != 0 {
		t.Fatalf("an empty sockhash: %d, %v", n, err)
	}
}

// TestFromIndex: the ends of ez_sc_index that iter/tcp did not list come
// from the index (batch reads, more than one batch), with their unread
// record and the server's cookie for a client whose index entry has none;
// ends listed already and ends without an unread record do not.
func TestFromIndex(t *testing.T) {
	const conns = entryBatch // two ends each: two batches at least
	index, unreads := indexMaps(t, conns)
	seen := map[uint64]bool{}
	for i := range uint64(conns) {
		client, server := 2*i+2, 2*i+3
		// The client's entry knows no peer yet; the server's does.
		if err := index.Put(client, shortcutEzConnIndex{Flags: uint32(shortcutEzSockFlagsEZ_F_CLIENT)}); err != nil {
			t.Fatal(err)
		}
		if err := index.Put(server, shortcutEzConnIndex{PeerCookie: client, Flags: uint32(shortcutEzSockFlagsEZ_F_SERVER)}); err != nil {
			t.Fatal(err)
		}
		if i%4 != 3 { // a quarter not paired yet: no unread record
			if err := unreads.Put(client, shortcutEzUnread{Unread: [2]int64{5, 7}}); err != nil {
				t.Fatal(err)
			}
		}
		if i%2 == 0 { // half listed by iter/tcp
			seen[client], seen[server] = true, true
		}
	}
	var got []Connection
	w := &window{ctx: t.Context(), emit: func(c Connection) error { got = append(got, c); return nil }}
	ls := lister{index: index, unreads: unreads, out: w}
	var l Listing
	if err := ls.fromIndex(&l, seen); err != nil {
		t.Fatal(err)
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	want := conns / 4 * 2 // odd i with an unread record: i%4 == 1
	if len(got) != want || l.Indexed != want {
		t.Fatalf("%d ends (Indexed %d), want %d", len(got), l.Indexed, want)
	}
	for _, c := range got {
		if !c.Indexed || (c.Role == "client" && (c.PeerCookie != c.Cookie+1 || c.RxUnread != 7)) || (c.Role == "server" && (c.PeerCookie != c.Cookie-1 || c.RxUnread != 5)) {
			t.Fatalf("end %+v", c)
		}
	}
}

// indexMaps makes an ez_sc_index and an ez_sc_unreads for conns
// connections (two ends each), closed when the test ends.
func indexMaps(t *testing.T, conns int) (index, unreads *ebpf.Map) {
	t.Helper()
	var err error
	index, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: uint32(binary.Size(shortcutEzConnIndex{})), MaxEntries: uint32(2 * conns)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { index.Close() })
	unreads, err = ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: uint32(binary.Size(shortcutEzUnread{})), MaxEntries: uint32(conns)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unreads.Close() })
	return index, unreads
}
