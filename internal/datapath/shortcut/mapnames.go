package shortcut

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// pinnedMaps are the maps pinned in the pin directory; the selection rule
// maps are not (every load writes its own).
var pinnedMaps = []string{
	shortcutMapEzScSockets, shortcutMapEzScPairs, shortcutMapEzScAliases, shortcutMapEzScSynIndex, shortcutMapEzScSocks,
	shortcutMapEzScCounters, shortcutMapEzScControl, shortcutMapEzScUnreads, shortcutMapEzScCgroups, shortcutMapEzScAdopts,
	shortcutMapEzScAdoptSocks, shortcutMapEzScAdoptHooks, shortcutMapEzScAdoptCounters, shortcutMapEzScResets,
	shortcutMapEzScResetCounters, shortcutMapEzScRxSocks,
}

// unprefixed is the name builds before the family prefix (ez_sc_) pinned
// a map under: ez_sc_sockets was ez_sockets.
func unprefixed(name string) string { return "ez_" + strings.TrimPrefix(name, "ez_sc_") }

// MigrateMapNames renames the maps an earlier build pinned in dir without
// the family prefix to their names now, within tx (nil: no rollback), so
// that this build's Load reuses them: an upgrade in place keeps every
// connection's state. Rollback gives them their old names back, for the
// earlier build's links. The kernel keeps the maps' own names (bpftool
// shows ez_sockets until the datapath is reinstalled). A build before the
// prefix, started over a datapath this build pinned, would not find its
// maps: going back across it needs `eztunnel uninstall` first.
func MigrateMapNames(tx *bpfsys.Tx, dir string) error {
	for _, name := range pinnedMaps {
		from, to := filepath.Join(dir, unprefixed(name)), filepath.Join(dir, name)
		if !bpfsys.Exists(from) || bpfsys.Exists(to) {
			continue
		}
		if err := bpfsys.MovePin(from, to); err != nil {
			return err
		}
		if tx == nil {
			continue
		}
		tx.OnRollback(func() error { return os.Rename(to, from) })
		if err := tx.Changed("rename " + from); err != nil {
			return err
		}
	}
	return nil
}

// mapPin is the pin of the map name in dir: its name now, or the one an
// earlier build pinned it under while no agent of this build has adopted
// the datapath (status and connections read it as it is).
func mapPin(dir, name string) string {
	pin := filepath.Join(dir, name)
	if old := filepath.Join(dir, unprefixed(name)); !bpfsys.Exists(pin) && bpfsys.Exists(old) {
		return old
	}
	return pin
}

// PinnedMaps lists the names of the maps pinned in the pin directory.
func PinnedMaps() []string { return slices.Clone(pinnedMaps) }
