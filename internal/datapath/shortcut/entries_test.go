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
