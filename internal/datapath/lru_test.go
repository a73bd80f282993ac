package datapath

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
)

// The maps of handshakes in flight as builds before LRU pinned them.
var hashPinned = []string{"ez_sc_pairs", "ez_sc_aliases", "ez_sc_syn_index"}

// pinAsHash replaces each of hashPinned in dir with a hash map
// (BPF_F_NO_PREALLOC) of the same key, value and size, as a build before
// LRU pinned it, holding one entry. Returns the entries by map.
func pinAsHash(t *testing.T, dir string) map[string][2][]byte {
	t.Helper()
	out := map[string][2][]byte{}
	for _, name := range hashPinned {
		pin := filepath.Join(dir, name)
		cur, err := ebpf.LoadPinnedMap(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		spec := &ebpf.MapSpec{Name: name, Type: ebpf.Hash, KeySize: cur.KeySize(), ValueSize: cur.ValueSize(), MaxEntries: cur.MaxEntries(), Flags: 1 /* BPF_F_NO_PREALLOC */}
		cur.Close()
		if err := os.Remove(pin); err != nil {
			t.Fatal(err)
		}
		m, err := ebpf.NewMap(spec)
		if err != nil {
			t.Fatal(err)
		}
		k, v := bytes.Repeat([]byte{0x5a}, int(spec.KeySize)), bytes.Repeat([]byte{0}, int(spec.ValueSize))
		v[0] = 7
		if err := m.Put(k, v); err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(pin); err != nil {
			t.Fatal(err)
		}
		m.Close()
		out[name] = [2][]byte{k, v}
	}
	return out
}

func checkPinned(t *testing.T, dir string, typ ebpf.MapType, entries map[string][2][]byte, when string) {
	t.Helper()
	for _, name := range hashPinned {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err != nil {
			t.Fatalf("%s: %s: %v", when, name, err)
		}
		if m.Type() != typ {
			t.Errorf("%s: %s is %v, want %v", when, name, m.Type(), typ)
		}
		e := entries[name]
		v := make([]byte, len(e[1]))
		if err := m.Lookup(e[0], &v); err != nil || !bytes.Equal(v, e[1]) {
			t.Errorf("%s: %s lost its entry: %v %x", when, name, err, v)
		}
		m.Close()
		if _, err := os.Stat(filepath.Join(dir, name+"_hash")); !os.IsNotExist(err) {
			t.Errorf("%s: %s_hash pin left: %v", when, name, err)
		}
	}
}

// TestUpgradeHashToLRU: a datapath pinned by a build whose maps of
// handshakes in flight were hash maps is taken over in place: a failed
// install leaves the hash maps as they were; an install migrates them to
// LRU with their entries, and unpins the old ones.
func TestUpgradeHashToLRU(t *testing.T) {
	cfg, cgs := kernelEnv(t, 1)
	install(t, cfg, cgs)
	entries := pinAsHash(t, cfg.Dir())

	installFailingAt(t, cfg, cgs, "update ")
	checkPinned(t, cfg.Dir(), ebpf.Hash, entries, "after a failed install")

	install(t, cfg, cgs)
	checkPinned(t, cfg.Dir(), ebpf.LRUHash, entries, "after the upgrade")
	if err := Uninstall(cfg, 0); err != nil {
		t.Fatal(err)
	}
}
