package shortcut

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
)

// MaxScope is how many cgroups ez_sc_cgroups holds (pods per node, with room).
const MaxScope = 4096

// SetScope makes ez_sc_cgroups hold exactly ids (bpf/shortcut/scope.h): new
// ids are inserted, ids no longer wanted deleted, kept ids keep their
// counts. Only new connections see the change.
func (s *Shortcut) SetScope(ids []uint64) (added, removed int, err error) {
	if len(ids) > MaxScope {
		return 0, 0, fmt.Errorf("%d cgroups selected, at most %d", len(ids), MaxScope)
	}
	want := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var stale []uint64
	var id uint64
	var v shortcutEzCgroup
	it := s.objs.EzScCgroups.Iterate()
	for it.Next(&id, &v) {
		if !want[id] {
			stale = append(stale, id)
		}
		delete(want, id)
	}
	if err := it.Err(); err != nil {
		return 0, 0, fmt.Errorf("read selected cgroups: %w", err)
	}
	for id := range want {
		if err := s.objs.EzScCgroups.Update(id, shortcutEzCgroup{}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return added, removed, fmt.Errorf("select cgroup %d: %w", id, err)
		}
		added++
	}
	for _, id := range stale {
		if err := s.objs.EzScCgroups.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return added, removed, fmt.Errorf("deselect cgroup %d: %w", id, err)
		}
		removed++
	}
	return added, removed, nil
}

// ReadScope returns the selected cgroups of a ez_sc_cgroups map with the
// sockets each enrolled.
func ReadScope(m *ebpf.Map) (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	var id uint64
	var v shortcutEzCgroup
	it := m.Iterate()
	for it.Next(&id, &v) {
		out[id] = v.Enrolled
	}
	return out, it.Err()
}

// AttachedCgroups lists the ids of the cgroups with links pinned under dir.
func AttachedCgroups(dir string) ([]uint64, error) {
	entries, err := os.ReadDir(bpfsys.LinkPin(dir, bpfsys.KindCgroup))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, e := range entries {
		id, err := strconv.ParseUint(e.Name(), 10, 64)
		if err != nil || !e.IsDir() {
			return nil, fmt.Errorf("unexpected pin %s in %s", e.Name(), bpfsys.LinkPin(dir, bpfsys.KindCgroup))
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// DetachCgroup unpins (so detaches) the links pinned for cgroup id, in the
// reverse of attach order: ez_sc_sockops goes before ez_sc_egress. A link whose
// cgroup was removed is already detached by the kernel; its pin goes too.
func DetachCgroup(dir string, id uint64) error {
	base := bpfsys.LinkPin(dir, bpfsys.KindCgroup, strconv.FormatUint(id, 10))
	for _, h := range slices.Backward(cgroupHooks) {
		if err := bpfsys.UnpinLink(filepath.Join(base, h.name)); err != nil {
			return err
		}
	}
	if err := os.Remove(base); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", base, err)
	}
	return nil
}

// ReconcileCgroups converges the cgroup links to paths while the agent
// runs: a path that exists and has no links pinned is attached, and the
// links of every other cgroup (removed, re-created under a new id, or no
// longer wanted) are detached. Paths that do not exist are skipped; missing
// lists them. Cheap when nothing changed: a stat per path and a directory read.
func (s *Shortcut) ReconcileCgroups(paths []string) (attached, missing []string, pruned []uint64, err error) {
	tx := &bpfsys.Tx{}
	want := map[uint64]bool{}
	var kept []uint64
	for _, p := range paths {
		id, err := cgroupv2.ID(p)
		if err != nil {
			missing = append(missing, p)
			continue
		}
		want[id] = true
		if bpfsys.Exists(bpfsys.LinkPin(s.dir, bpfsys.KindCgroup, strconv.FormatUint(id, 10), s.lastHook())) {
			kept = append(kept, id)
			continue
		}
		if _, err := s.attachCgroup(tx, p); err != nil {
			if rerr := tx.Rollback(); rerr != nil {
				err = fmt.Errorf("%w (and rollback failed: %v)", err, rerr)
			}
			// Unpinned by the rollback; these handles are all that hold them.
			for id := range want {
				if !slices.Contains(kept, id) {
					for _, l := range s.cgLinks[id] {
						l.Close()
					}
					delete(s.cgLinks, id)
				}
			}
			return nil, missing, nil, err
		}
		attached = append(attached, p)
	}
	if err := s.pruneCgroups(tx, want); err != nil {
		tx.Rollback()
		return nil, missing, nil, err
	}
	if err := tx.Commit(); err != nil {
		return attached, missing, nil, err
	}
	return attached, missing, s.Pruned(), nil
}
