package datapath

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// releaseGrace is how long uninstall waits after setting the draining flag
// before handing sockets back: a sendmsg that read the flag just before it
// was set finishes its redirect (under the socket lock) well within it.
const releaseGrace = 200 * time.Millisecond

// Uninstall removes an installed datapath without losing or reordering a
// byte of any established connection:
//  1. detach every link: no socket is enrolled any more;
//  2. set the draining flag: from their next message on, paired sockets send
//     through the kernel (bytes redirected earlier are read first);
//  3. hand each enrolled socket back to the kernel path as soon as its psock
//     queue is empty (ez_release iterator), repeating until none is left;
//  4. detach sk_msg and remove every pin.
//
// If sockets still hold unread redirected bytes after drain, it returns an
// error and leaves the maps pinned (rerun it): removing the sockhash would
// discard those bytes.
func Uninstall(cfg Config, drain time.Duration) error {
	dir := cfg.Dir()
	if !exists(dir) {
		return fmt.Errorf("%w at %s", ErrNotInstalled, dir)
	}
	if err := detachLinks(dir); err != nil {
		return err
	}
	pinned := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return m, err
	}
	sockets, err := pinned(shortcutMapEzSockets)
	if err != nil {
		return fmt.Errorf("open pinned sockhash: %w", err)
	}
	if sockets != nil {
		defer sockets.Close()
		if err := drainSockets(dir, sockets, drain); err != nil {
			return err
		}
		if prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, "prog_ez_msg"), nil); err == nil {
			link.RawDetachProgram(link.RawDetachProgramOptions{Target: sockets.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict})
			prog.Close()
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove pins: %w", err)
	}
	// Remove the root too when nothing else (another schema) lives there.
	os.Remove(cfg.PinRoot)
	return nil
}

// detachLinks unpins and closes every pinned link: a pinned link lives as
// long as its pin.
func detachLinks(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "link_") {
			continue
		}
		pin := filepath.Join(dir, e.Name())
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			return fmt.Errorf("open pinned link %s: %w", pin, err)
		}
		err = l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("unpin %s: %w", pin, err)
		}
	}
	return nil
}

// drainSockets sets the draining flag and runs the release iterator until
// the sockhash is empty or drain has passed.
func drainSockets(dir string, sockets *ebpf.Map, drain time.Duration) error {
	n, err := Entries(sockets)
	if err != nil || n == 0 {
		return err
	}
	control, err := ebpf.LoadPinnedMap(filepath.Join(dir, shortcutMapEzControl), nil)
	if err != nil {
		return fmt.Errorf("open pinned control map: %w", err)
	}
	defer control.Close()
	counters, err := ebpf.LoadPinnedMap(filepath.Join(dir, shortcutMapEzCounters), nil)
	if err != nil {
		return fmt.Errorf("open pinned counters: %w", err)
	}
	defer counters.Close()
	if err := control.Put(uint32(shortcutEzControlEZ_CTL_DRAINING), uint32(1)); err != nil {
		return fmt.Errorf("set draining: %w", err)
	}
	release, err := loadRelease(sockets, counters)
	if err != nil {
		return err
	}
	defer release.Close()
	time.Sleep(releaseGrace)
	deadline := time.Now().Add(drain)
	for {
		if err := runIter(release, sockets); err != nil {
			return fmt.Errorf("release sockets: %w", err)
		}
		n, err := Entries(sockets)
		if err != nil {
			return fmt.Errorf("count enrolled sockets: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sockets still hold redirected bytes their applications have not read after %s; enrolment is stopped and nothing more is redirected; the datapath stays pinned in %s: rerun uninstall", n, drain, dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loadRelease loads only the ez_release iterator, against the pinned maps.
func loadRelease(sockets, counters *ebpf.Map) (*ebpf.Program, error) {
	spec, err := loadShortcut()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Release *ebpf.Program `ebpf:"ez_release"`
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{
		shortcutMapEzSockets:  sockets,
		shortcutMapEzCounters: counters,
	}}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return nil, fmt.Errorf("load release iterator: %w", err)
	}
	return objs.Release, nil
}

// runIter runs an iterator program over a map once.
func runIter(prog *ebpf.Program, m *ebpf.Map) error {
	it, err := link.AttachIter(link.IterOptions{Program: prog, Map: m})
	if err != nil {
		return err
	}
	defer it.Close()
	r, err := it.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(io.Discard, r)
	return err
}
