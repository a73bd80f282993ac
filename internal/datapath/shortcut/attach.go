package shortcut

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
)

// cgroupHook is one program attached to every managed cgroup.
type cgroupHook struct {
	name   string // program name, the link's pin name
	attach ebpf.AttachType
	prog   func(*Shortcut) *ebpf.Program
}

// Order matters: the egress program must see a client's SYN before sockops
// can enrol it, so egress is attached first and detached last.
var cgroupHooks = []cgroupHook{
	{shortcutProgEzScEgress, ebpf.AttachCGroupInetEgress, func(s *Shortcut) *ebpf.Program { return s.objs.EzScEgress }},
	{shortcutProgEzScSockops, ebpf.AttachCGroupSockOps, func(s *Shortcut) *ebpf.Program { return s.objs.EzScSockops }},
	{shortcutProgEzScSockRelease, ebpf.AttachCgroupInetSockRelease, func(s *Shortcut) *ebpf.Program { return s.objs.EzScSockRelease }},
}

// lastHook is the last cgroup hook this load attaches: its pin marks a
// cgroup whose hooks are all attached.
func (s *Shortcut) lastHook() string {
	name := ""
	for _, h := range cgroupHooks {
		if h.prog(s) != nil {
			name = h.name
		}
	}
	return name
}

// pinnedProgs are the programs pinned under progsDir: the cgroup hooks' and
// the close-reset program of the device links.
func pinnedProgs(s *Shortcut) map[string]*ebpf.Program {
	out := map[string]*ebpf.Program{}
	if s.objs.EzScCloseReset != nil {
		out[resetProg] = s.objs.EzScCloseReset
	}
	for _, h := range cgroupHooks {
		if p := h.prog(s); p != nil { // nil: its part is off on this kernel
			out[h.name] = p
		}
	}
	return out
}

// msgPin pins the sk_msg program attached to the sockhash (not a link).
const msgPin = "prog_" + shortcutProgEzScMsg

// attachMsg attaches sk_msg to the sockhash, replacing the program of an
// earlier install; on rollback the earlier program is attached again.
func (s *Shortcut) attachMsg(tx *bpfsys.Tx) error {
	pin := filepath.Join(s.dir, msgPin)
	opts := link.RawAttachProgramOptions{Target: s.objs.EzScSockets.FD(), Program: s.objs.EzScMsg, Attach: ebpf.AttachSkMsgVerdict}
	old, err := ebpf.LoadPinnedProgram(pin, nil)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned sk_msg program: %w", err)
	}
	if old != nil {
		tx.OnDone(old.Close)
	}
	if err := link.RawAttachProgram(opts); err != nil {
		return fmt.Errorf("attach sk_msg to sockhash: %w", err)
	}
	tx.OnRollback(func() error {
		if old != nil {
			return link.RawAttachProgram(link.RawAttachProgramOptions{Target: opts.Target, Program: old, Attach: opts.Attach})
		}
		return link.RawDetachProgram(link.RawDetachProgramOptions{Target: opts.Target, Program: opts.Program, Attach: opts.Attach})
	})
	if err := tx.Changed("attach sk_msg"); err != nil {
		return err
	}
	// The new pin replaces the old one on commit (rename over it). Quirk:
	// bpffs refuses names with a dot.
	next := pin + "_next"
	os.Remove(next)
	if err := s.objs.EzScMsg.Pin(next); err != nil {
		return fmt.Errorf("pin sk_msg program: %w", err)
	}
	tx.OnRollback(func() error { return os.Remove(next) })
	tx.OnCommit(func() error { return os.Rename(next, pin) })
	return nil
}

// progsDir holds the programs of the cgroup links, pinned so that the next
// install can hold a link's current program for rollback without looking it
// up by id (which needs CAP_SYS_ADMIN).
const progsDir = "progs"

// pinCgroupPrograms pins this install's cgroup and device programs under
// progsDir (the earlier install's pins are replaced on commit) and opens the
// earlier ones.
func (s *Shortcut) pinCgroupPrograms(tx *bpfsys.Tx) error {
	dir := filepath.Join(s.dir, progsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	s.prevProgs = map[string]*ebpf.Program{}
	tx.OnDone(func() error { s.prevProgs = nil; return nil })
	for name, prog := range pinnedProgs(s) {
		pin := filepath.Join(dir, name)
		if old, err := ebpf.LoadPinnedProgram(pin, nil); err == nil {
			s.prevProgs[name] = old
			tx.OnDone(old.Close)
		}
		next := pin + "_next"
		os.Remove(next)
		if err := prog.Pin(next); err != nil {
			return fmt.Errorf("pin %s: %w", name, err)
		}
		tx.OnRollback(func() error { return os.Remove(next) })
		tx.OnCommit(func() error { return os.Rename(next, pin) })
		if err := tx.Changed("pin program " + name); err != nil {
			return err
		}
	}
	return nil
}

// attachCgroup attaches the cgroup hooks to a cgroup v2 subtree, updating
// the links pinned for it by an earlier install in place (no gap).
func (s *Shortcut) attachCgroup(tx *bpfsys.Tx, cgroupPath string) (uint64, error) {
	if err := cgroupv2.Validate(cgroupPath); err != nil {
		return 0, err
	}
	cgID, err := cgroupv2.ID(cgroupPath)
	if err != nil {
		return 0, err
	}
	for _, h := range cgroupHooks {
		if h.prog(s) == nil {
			continue // its part is off on this kernel (s.parts)
		}
		pin := bpfsys.LinkPin(s.dir, bpfsys.KindCgroup, strconv.FormatUint(cgID, 10), h.name)
		l, ok, err := tx.UpdatePinned(pin, h.prog(s), s.prevProgs[h.name])
		if l != nil {
			s.cgLinks[cgID] = append(s.cgLinks[cgID], l)
		}
		if err != nil {
			return 0, fmt.Errorf("%s on cgroup %s: %w", h.name, cgroupPath, err)
		}
		if ok {
			continue
		}
		l, err = link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: h.attach, Program: h.prog(s)})
		if err != nil {
			return 0, fmt.Errorf("attach %s to cgroup %s: %w", h.name, cgroupPath, err)
		}
		s.cgLinks[cgID] = append(s.cgLinks[cgID], l)
		if err := tx.PinLink(l, pin); err != nil {
			return 0, err
		}
	}
	return cgID, nil
}

// MigrateFlatLinks moves the links pinned by builds before per-kind link
// directories (<dir>/link_<hook>_<cgroup id>, <dir>/link_nat_<family>) to
// their places under <dir>/links, so adoption and uninstall find them.
func MigrateFlatLinks(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), "link_")
		if !ok || e.IsDir() {
			continue
		}
		var to string
		if fam, ok := strings.CutPrefix(name, "nat_"); ok {
			to = bpfsys.LinkPin(dir, bpfsys.KindNetfilter, "ez_nat_"+fam)
		} else if hook, id, ok := strings.Cut(name, "_"); ok {
			to = bpfsys.LinkPin(dir, bpfsys.KindCgroup, id, "ez_"+hook)
		} else {
			return fmt.Errorf("unknown pinned link %s in %s", e.Name(), dir)
		}
		if err := bpfsys.MovePin(filepath.Join(dir, e.Name()), to); err != nil {
			return err
		}
	}
	return nil
}
