package shortcut

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// releaseGrace is how long uninstall waits after setting the draining flag
// before handing sockets back: a sendmsg that read the flag just before it
// was set finishes its redirect (under the socket lock) well within it.
const releaseGrace = 200 * time.Millisecond

// Release hands every enrolled socket back to the kernel path without losing
// or reordering a byte, then detaches sk_msg. The links must be gone already
// (no socket is enrolled any more):
//  1. set the draining flag: from their next message on, paired sockets send
//     through the kernel (bytes redirected earlier are read first);
//  2. hand each enrolled socket back as soon as its psock queue is empty
//     (ez_sc_release, run per socket), repeating until none is left;
//  3. detach sk_msg.
//
// If sockets still hold unread redirected bytes after drain, it returns an
// error and leaves the maps pinned (rerun it): removing the sockhash would
// discard those bytes.
func Release(dir string, drain time.Duration) error {
	sockets, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScSockets), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned sockhash: %w", err)
	}
	defer sockets.Close()
	if err := drainSockets(dir, sockets, drain); err != nil {
		return err
	}
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, msgPin), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned sk_msg program: %w", err)
	}
	defer prog.Close()
	err = link.RawDetachProgram(link.RawDetachProgramOptions{Target: sockets.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict})
	if err != nil && !errors.Is(err, os.ErrNotExist) { // detached by an earlier run
		return fmt.Errorf("detach sk_msg: %w", err)
	}
	return nil
}

// drainSockets sets the draining flag and runs ez_sc_release until
// the sockhash is empty or drain has passed.
func drainSockets(dir string, sockets *ebpf.Map, drain time.Duration) error {
	n, err := Entries(sockets)
	if err != nil || n == 0 {
		return err
	}
	control, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScControl), nil)
	if err != nil {
		return fmt.Errorf("open pinned control map: %w", err)
	}
	defer control.Close()
	counters, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScCounters), nil)
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
		if _, _, err := releasePass(release, sockets); err != nil {
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
			return fmt.Errorf("%w: %d sockets still hold redirected bytes their applications have not read after %s; enrolment is stopped and nothing more is redirected; the datapath stays pinned in %s: rerun uninstall", ErrPartial, n, drain, dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loadRelease loads only ez_sc_release, against the pinned maps.
func loadRelease(sockets, counters *ebpf.Map) (*ebpf.Program, error) {
	spec, err := loadShortcut()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Release *ebpf.Program `ebpf:"ez_sc_release"`
	}
	spec, opts := againstPinned(spec, map[string]*ebpf.Map{
		shortcutMapEzScSockets:  sockets,
		shortcutMapEzScCounters: counters,
	})
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return nil, fmt.Errorf("load ez_sc_release (shortcut release): %w", err)
	}
	return objs.Release, nil
}
