package services

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Migrate takes over what an earlier build pinned under pinDir, within tx
// (datapath's install transaction): its pins into the family's directory
// (migratePins), and its frontend maps into the values of this build
// (migrateValues).
func Migrate(tx *bpfsys.Tx, pinDir string) error {
	if err := migratePins(tx, pinDir); err != nil {
		return err
	}
	return migrateValues(tx, mapDir(pinDir))
}

// The values of ez_svc_frontends and ez_svc_nodeports as builds before
// inline backends (EZ_SVC_INLINE) pinned them.
type (
	svcV1 struct{ Id, Count, Affinity uint32 }
	npV1  struct {
		Svc   svcV1
		Flags uint32
	}
)

// migrateValues rewrites the frontend and NodePort maps an earlier build
// pinned in fam with smaller values into new maps of this build's values,
// each frontend of few backends carrying them (read from the pinned slots
// and backends), and pins the new maps in their place within tx: rollback
// pins the old ones back, commit unpins them. Until the install updates
// the links, the earlier programs keep the old maps, which nothing writes
// meanwhile; the new programs find every frontend in the new ones.
func migrateValues(tx *bpfsys.Tx, fam string) error {
	spec, err := loadServices()
	if err != nil {
		return fmt.Errorf("services: %w", err)
	}
	for _, name := range []string{servicesMapEzSvcFrontends, servicesMapEzSvcNodeports} {
		if err := migrateMap(tx, fam, spec.Maps[name]); err != nil {
			return fmt.Errorf("services: migrate %s: %w", name, err)
		}
	}
	return nil
}

func migrateMap(tx *bpfsys.Tx, fam string, ms *ebpf.MapSpec) error {
	pin := filepath.Join(fam, ms.Name)
	old, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer old.Close()
	if old.ValueSize() == ms.ValueSize {
		return nil
	}
	var oldSize uint32
	if ms.Name == servicesMapEzSvcFrontends {
		oldSize = 12
	} else {
		oldSize = 16
	}
	if old.ValueSize() != oldSize {
		return fmt.Errorf("pinned with values of %d bytes, neither this build's %d nor the earlier %d; run `eztunnel uninstall` first", old.ValueSize(), ms.ValueSize, oldSize)
	}
	slots, err := ebpf.LoadPinnedMap(filepath.Join(fam, servicesMapEzSvcSlots), nil)
	if err != nil {
		return err
	}
	defer slots.Close()
	backends, err := ebpf.LoadPinnedMap(filepath.Join(fam, servicesMapEzSvcBackends), nil)
	if err != nil {
		return err
	}
	defer backends.Close()
	inline := func(v1 svcV1) (servicesEzSvc, error) {
		v := servicesEzSvc{Id: v1.Id, Count: v1.Count, Affinity: v1.Affinity}
		if v1.Count > uint32(len(v.Ids)) {
			return v, nil
		}
		for i := range v1.Count {
			if err := slots.Lookup(servicesEzSvcSlotKey{Id: v1.Id, Slot: i}, &v.Ids[i]); err != nil {
				return v, fmt.Errorf("frontend %d slot %d: %w", v1.Id, i, err)
			}
			if err := backends.Lookup(v.Ids[i], &v.Be[i]); err != nil {
				return v, fmt.Errorf("frontend %d backend %d: %w", v1.Id, v.Ids[i], err)
			}
		}
		return v, nil
	}

	return bpfsys.ReplacePinnedMap(tx, pin, "_v1", ms, old, func(m *ebpf.Map) (int, error) {
		n := 0
		if ms.Name == servicesMapEzSvcFrontends {
			var k servicesEzSvcKey
			var v1 svcV1
			it := old.Iterate()
			for it.Next(&k, &v1) {
				v, err := inline(v1)
				if err != nil {
					return n, err
				}
				if err := m.Put(k, v); err != nil {
					return n, err
				}
				n++
			}
			return n, it.Err()
		}
		var k servicesEzSvcNpKey
		var v1 npV1
		it := old.Iterate()
		for it.Next(&k, &v1) {
			svc, err := inline(v1.Svc)
			if err != nil {
				return n, err
			}
			if err := m.Put(k, servicesEzSvcNp{Svc: svc, Flags: v1.Flags}); err != nil {
				return n, err
			}
			n++
		}
		return n, it.Err()
	})
}
