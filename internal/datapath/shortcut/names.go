package shortcut

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// pinnedMaps are the maps pinned in the pin directory; the selection rule
// maps are not (every load writes its own).
var pinnedMaps = []string{
	shortcutMapEzScSockets, shortcutMapEzScPairs, shortcutMapEzScProofs, shortcutMapEzScAliases, shortcutMapEzScSynIndex, shortcutMapEzScSocks,
	shortcutMapEzScCounters, shortcutMapEzScControl, shortcutMapEzScUnreads, shortcutMapEzScCgroups, shortcutMapEzScAdopts,
	shortcutMapEzScAdoptSocks, shortcutMapEzScAdoptHooks, shortcutMapEzScAdoptCounters, shortcutMapEzScResets,
	shortcutMapEzScResetCounters, shortcutMapEzScRxSocks, shortcutMapEzScRx, shortcutMapEzScSplicers, shortcutMapEzScIndex,
}

// unprefixed is the name builds before the family prefix (ez_sc_) pinned
// a map under: ez_sc_sockets was ez_sockets.
func unprefixed(name string) string { return "ez_" + strings.TrimPrefix(name, "ez_sc_") }

// renamedProgs are the programs whose names are in pins: cgroup, tcx,
// netfilter and tracing links, the programs under progs/, the sk_msg
// program. Legacy tc filters keep their name (resetFilterName).
var renamedProgs = []string{
	shortcutProgEzScEgress, shortcutProgEzScSockops, shortcutProgEzScSockRelease, shortcutProgEzScCloseReset,
	shortcutProgEzScMsg, shortcutProgEzScNat, shortcutProgEzScNatDev, shortcutProgEzScRecv,
}

// renamedPin is the name now of a pin an earlier build named after an
// unprefixed program (ez_egress, ez_close_reset_egress, ez_nat_ipv4,
// prog_ez_msg), or "".
func renamedPin(base string) string {
	for _, name := range renamedProgs {
		old := unprefixed(name)
		switch rest, ok := strings.CutPrefix(base, old); {
		case !ok:
		case rest == "", rest == "_next":
			return name + rest
		case rest == "_ingress", rest == "_egress", rest == "_ipv4", rest == "_ipv6", rest == "_ipv4_next", rest == "_ipv6_next":
			return name + rest
		}
		if base == "prog_"+old {
			return "prog_" + name
		}
	}
	return ""
}

// MigrateNames renames what an earlier build pinned in dir under the
// names before the family prefix (ez_sc_) to the names now, within tx
// (nil: no rollback): the maps (ez_sockets is ez_sc_sockets), so that
// this build's Load reuses them and an upgrade in place keeps every
// connection's state, and the links and programs named after a program
// (links/cgroup/<id>/ez_egress is .../ez_sc_egress), so that the install
// updates them in place. Rollback gives everything its old name back, for
// the earlier build's links. The kernel keeps the objects' own names
// (bpftool shows ez_sockets until the datapath is reinstalled). A build
// before the prefix, started over a datapath this build pinned, would not
// find its maps: going back across it needs `eztunnel uninstall` first.
func MigrateNames(tx *bpfsys.Tx, dir string) error {
	var moves [][2]string
	for _, name := range pinnedMaps {
		moves = append(moves, [2]string{filepath.Join(dir, unprefixed(name)), filepath.Join(dir, name)})
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			if path != dir && rel != bpfsys.LinksDir && rel != progsDir && !strings.HasPrefix(rel, bpfsys.LinksDir+"/") {
				return fs.SkipDir // maps of other families, legacy tc records
			}
			return nil
		}
		if to := renamedPin(d.Name()); to != "" {
			moves = append(moves, [2]string{path, filepath.Join(filepath.Dir(path), to)})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, m := range moves {
		from, to := m[0], m[1]
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
