package bpfsys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// AttachTCFilter attaches prog as f in the calling thread's netns (cookie:
// its cookie) within tx, recorded under dir (AttachTCFilter): a filter an
// earlier agent recorded there gets prog in place, and gets its own program
// back on rollback; a new one is detached on rollback.
func (tx *Tx) AttachTCFilter(dir string, cookie uint64, f TCFilter, prog *ebpf.Program) error {
	rec := TCRecord(dir, cookie, f)
	prev, _ := ebpf.LoadPinnedProgram(rec, nil)
	if err := AttachTCFilter(dir, cookie, f, prog); err != nil {
		if prev != nil {
			prev.Close()
		}
		return err
	}
	tx.OnRollback(func() error {
		if prev == nil {
			return DetachTCFilter(rec)
		}
		return InNetNSCookie(cookie, func() error { return AttachTCFilter(dir, cookie, f, prev) })
	})
	if prev != nil {
		tx.OnDone(prev.Close)
	}
	return tx.Changed("tc " + rec)
}

// UpgradePinned gives every link pinned under dir (a family's directory),
// and every legacy tc filter recorded there, whose pin names one of progs
// (by the source's name: <program>, or <program>_<direction> for tcx)
// that program in place. This
// is how a family's new build takes over what an earlier agent pinned
// before the family converges. A legacy filter is replaced within tx (its
// record holds the old program: rollback puts it back). A link's update
// waits for Commit (UpdatePinnedLink; the shortcut pins the programs it may
// roll back to, these families do not). Until the commit the earlier
// programs run, against the same maps. It returns how many it
// upgrades.
func (tx *Tx) UpgradePinned(dir string, progs map[string]*ebpf.Program) (int, error) {
	// By the source's name, and by the 15 bytes of it the kernel keeps
	// where no other program shares them (a pin an agent named from the
	// program's info, which cilium/ebpf completes from BTF only where
	// BPF_BTF_GET_FD_BY_ID is allowed).
	byName, cut := map[string]*ebpf.Program{}, map[string]int{}
	for name, p := range progs {
		byName[name] = p
		cut[kernelName(name)]++
	}
	for name, p := range progs {
		if k := kernelName(name); k != name && cut[k] == 1 && progs[k] == nil {
			byName[k] = p
		}
	}
	pins, err := PinnedLinks(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pin := range pins {
		base := filepath.Base(pin)
		p := byName[base]
		if p == nil {
			if i := strings.LastIndexByte(base, '_'); i > 0 && (base[i+1:] == "ingress" || base[i+1:] == "egress") {
				p = byName[base[:i]]
			}
		}
		if p == nil {
			continue
		}
		l, err := tx.UpdatePinnedLink(pin, p)
		if err == nil && l == nil {
			err = os.ErrNotExist // gone since PinnedLinks listed it
		}
		if err != nil {
			return n, fmt.Errorf("open pinned link %s: %w", pin, err)
		}
		tx.OnDone(l.Close)
		n++
	}
	recs, err := TCRecords(dir)
	if err != nil {
		return n, err
	}
	for _, rec := range recs {
		cookie, f, err := ParseTCRecord(rec)
		if err != nil {
			continue
		}
		p := byName[f.Name]
		if p == nil {
			continue
		}
		err = InNetNSCookie(cookie, func() error { return tx.AttachTCFilter(dir, cookie, f, p) })
		if errors.Is(err, errNoSuchNetNS) || errors.Is(err, ErrDeviceGone) {
			continue // gone with its namespace or device: the family prunes the record
		}
		if err != nil {
			return n, fmt.Errorf("upgrade %s: %w", rec, err)
		}
		n++
	}
	return n, nil
}

// UpdatePinnedLink opens the link pinned at pin, if there is one (nil, nil:
// none), and gives it prog when tx commits, not before: giving a link its
// old program back on rollback would need that program, which only its id
// names, and opening a program by id needs CAP_SYS_ADMIN, which the agent
// does not have. Until the commit the earlier program runs. The caller
// closes the link.
func (tx *Tx) UpdatePinnedLink(pin string, prog *ebpf.Program) (link.Link, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	tx.OnCommit(func() error {
		if err := l.Update(prog); err != nil {
			return fmt.Errorf("update pinned link %s: %w", pin, err)
		}
		return nil
	})
	return l, nil
}

// kernelName is name as the kernel keeps it (BPF_OBJ_NAME_LEN with its NUL).
func kernelName(name string) string {
	if len(name) > 15 {
		return name[:15]
	}
	return name
}

// MovePins moves each link pinned under dir/links and each legacy tc
// record under dir/tc to the path dest gives it ("": it stays), within tx
// (nil: no rollback): rollback moves them back. Directories left empty are
// removed. A family whose pins an earlier build kept elsewhere takes them
// over with it.
func MovePins(tx *Tx, dir string, dest func(rel string) string) error {
	pins, err := PinnedLinks(dir)
	if err != nil {
		return err
	}
	recs, err := TCRecords(dir)
	if err != nil {
		return err
	}
	for _, from := range append(pins, recs...) {
		rel, err := filepath.Rel(dir, from)
		if err != nil {
			return err
		}
		to := dest(rel)
		if to == "" || Exists(to) {
			continue
		}
		if err := MovePin(from, to); err != nil {
			return err
		}
		for d := filepath.Dir(from); d != dir && os.Remove(d) == nil; d = filepath.Dir(d) {
		}
		if tx == nil {
			continue
		}
		tx.OnRollback(func() error {
			err := MovePin(to, from)
			for d := filepath.Dir(to); d != dir && os.Remove(d) == nil; d = filepath.Dir(d) {
			}
			return err
		})
		if err := tx.Changed("move " + from); err != nil {
			return err
		}
	}
	return nil
}

// ReplacePinnedMap puts a new map in place of the one pinned at pin, within
// tx (an upgrade whose map changed type or values): a map of spec, unpinned,
// with old's max entries, which fill copies old's entries into (returning how
// many), pinned at pin while old's pin moves to pin+suffix. Rollback pins
// old back; commit removes it.
func ReplacePinnedMap(tx *Tx, pin, suffix string, spec *ebpf.MapSpec, old *ebpf.Map, fill func(m *ebpf.Map) (int, error)) error {
	cp := spec.Copy()
	cp.Pinning = ebpf.PinNone
	cp.MaxEntries = old.MaxEntries()
	m, err := ebpf.NewMap(cp)
	if err != nil {
		return err
	}
	tx.OnDone(m.Close)
	n, err := fill(m)
	if err != nil {
		return err
	}
	prev := pin + suffix
	if err := MovePin(pin, prev); err != nil {
		return err
	}
	tx.OnRollback(func() error { return MovePin(prev, pin) })
	if err := m.Pin(pin); err != nil {
		return err
	}
	tx.OnRollback(m.Unpin)
	tx.OnCommit(func() error { return os.Remove(prev) })
	return tx.Changed(fmt.Sprintf("migrate %s to %v (%d entries)", pin, spec.Type, n))
}
