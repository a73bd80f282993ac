package shortcut

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Migrate takes over what an earlier build pinned in dir, within tx:
// the names before the family prefix (MigrateNames), and the maps of
// handshakes in flight that builds before LRU pinned as hash maps
// (migrateLRU).
func Migrate(tx *bpfsys.Tx, dir string) error {
	if err := MigrateNames(tx, dir); err != nil {
		return err
	}
	return migrateLRU(tx, dir)
}

// lruMaps are the maps this build makes LRU (bpf/shortcut/shortcut.bpf.c) that
// earlier builds pinned as BPF_MAP_TYPE_HASH.
var lruMaps = []string{shortcutMapEzScPairs, shortcutMapEzScAliases, shortcutMapEzScSynIndex}

// migrateLRU replaces each of lruMaps pinned in dir as a hash map (which
// this build's Load would refuse: ErrMapIncompatible) with an LRU map of
// the same size holding a copy of its entries, pinned in its place within
// tx: rollback pins the old one back, commit unpins it. Records are of
// handshakes in flight: until the install updates the links, the earlier
// programs write to the old maps, so a handshake that straddles the swap
// finds no record, or half of it, in the new maps, and only falls back
// (no record, no proof: fallback_no_local_peer, fallback_unproven; a
// waiting client settles KERNEL, sockops.h settle_client). Nothing pairs
// on an address alone: a record pairs only with its proof's ISNs.
func migrateLRU(tx *bpfsys.Tx, dir string) error {
	spec, err := loadShortcut()
	if err != nil {
		return fmt.Errorf("parse embedded object: %w", err)
	}
	for _, name := range lruMaps {
		if err := migrateMapType(tx, dir, spec.Maps[name]); err != nil {
			return fmt.Errorf("migrate %s to %v: %w", name, spec.Maps[name].Type, err)
		}
	}
	return nil
}

func migrateMapType(tx *bpfsys.Tx, dir string, ms *ebpf.MapSpec) error {
	pin := filepath.Join(dir, ms.Name)
	old, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer old.Close()
	if old.Type() == ms.Type {
		return nil
	}
	if old.Type() != ebpf.Hash || old.KeySize() != ms.KeySize || old.ValueSize() != ms.ValueSize {
		return fmt.Errorf("pinned as %v with keys of %d and values of %d bytes, not an earlier build's hash map of this build's %d and %d; run `eztunnel uninstall` first",
			old.Type(), old.KeySize(), old.ValueSize(), ms.KeySize, ms.ValueSize)
	}
	return bpfsys.ReplacePinnedMap(tx, pin, "_hash", ms, old, func(m *ebpf.Map) (int, error) {
		k, v := make([]byte, ms.KeySize), make([]byte, ms.ValueSize)
		n := 0
		it := old.Iterate()
		for it.Next(&k, &v) {
			if err := m.Put(k, v); err != nil {
				return n, err
			}
			n++
		}
		return n, it.Err()
	})
}
