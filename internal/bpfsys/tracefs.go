package bpfsys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// tracefsDir is where tracefs is mounted on a host that mounts it, and where
// the private mount goes (the empty directory sysfs keeps for it).
const tracefsDir = "/sys/kernel/tracing"

var eventIDs sync.Map // "group/name" -> uint64: an event's id never changes while the kernel runs

// TraceEventID is the perf id of the trace event group:name (e.g.
// syscalls:sys_enter_splice), which perf_event_open needs to attach to it.
// Only tracefs tells it: read from the host's mount where there is one,
// else from a private mount, in a mount namespace of its own that a
// dedicated thread makes and keeps for the process's life: nothing of it is
// visible on the host. The private mount needs
// CAP_SYS_ADMIN (unshare, mount); without it, and where tracefs is not in
// the kernel, the error says so.
func TraceEventID(group, name string) (uint64, error) {
	key := group + "/" + name
	if id, ok := eventIDs.Load(key); ok {
		return id.(uint64), nil
	}
	rel := filepath.Join("events", group, name, "id")
	id, err := readEventID(filepath.Join(tracefsDir, rel))
	if err != nil {
		if id, err = privateTracefs(rel); err != nil {
			return 0, fmt.Errorf("trace event %s:%s: %w", group, name, err)
		}
	}
	eventIDs.Store(key, id)
	return id, nil
}

func readEventID(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// privateTracefs reads rel from a tracefs mounted in a mount namespace of
// a thread of its own. That thread lives as long as the process: one
// goroutine, locked to it, serves every read. It must never exit: a thread
// that exits sends its parent-death signal (PR_SET_PDEATHSIG, which the lab
// sets on the pods' processes) to every child process it happened to fork
// before the goroutine locked it, which killed lab servers ("connection
// refused") while an earlier version let the thread end.
func privateTracefs(rel string) (uint64, error) {
	tracefsOnce.Do(func() {
		tracefsReqs = make(chan tracefsReq)
		ready := make(chan error)
		go serveTracefs(ready)
		tracefsErr = <-ready
	})
	if tracefsErr != nil {
		return 0, tracefsErr
	}
	req := tracefsReq{rel: rel, reply: make(chan tracefsReply, 1)}
	tracefsReqs <- req
	r := <-req.reply
	return r.id, r.err
}

type tracefsReq struct {
	rel   string
	reply chan tracefsReply
}

type tracefsReply struct {
	id  uint64
	err error
}

var (
	tracefsOnce sync.Once
	tracefsReqs chan tracefsReq
	tracefsErr  error
)

// serveTracefs makes the private namespace and mount on a locked thread,
// reports it on ready, then answers reads forever (never unlocks, never
// returns; after a failure it parks: the thread's namespace may be half
// made).
func serveTracefs(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: see privateTracefs
	err := func() error {
		// CLONE_NEWNS implies CLONE_FS: this thread gets a copy of the
		// process's root and cwd and a copy of its mounts.
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("private tracefs: unshare mount namespace: %w", err)
		}
		// The copy's mounts propagate to the host's peers unless private.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("private tracefs: make mounts private: %w", err)
		}
		if err := unix.Mount("tracefs", tracefsDir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("private tracefs: mount tracefs on %s: %w", tracefsDir, err)
		}
		return nil
	}()
	ready <- err
	if err != nil {
		select {}
	}
	for req := range tracefsReqs {
		id, err := readEventID(filepath.Join(tracefsDir, req.rel))
		if err != nil {
			err = fmt.Errorf("private tracefs: %w", err)
		}
		req.reply <- tracefsReply{id, err}
	}
}

// AttachTraceEvent attaches prog (a tracepoint program) to the trace event
// group:name through a perf event of its own (perf_event_open on every CPU,
// as link.Tracepoint does, but with the event's id from TraceEventID) and a
// BPF perf link. The returned link owns the perf event's fd and closes it
// exactly once, after the BPF link, on Close. The kernel's perf link holds
// its own reference to the event (so a pin keeps it attached after this
// process exits), but the fd must have exactly one owner: closing an fd
// number that something else still holds (an os.File, a cilium/ebpf sys.FD,
// each closed again by its finalizer) closes whatever reused the number
// meanwhile, a socket or a map of the same process.
func AttachTraceEvent(group, name string, prog *ebpf.Program) (link.Link, error) {
	id, err := TraceEventID(group, name)
	if err != nil {
		return nil, err
	}
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: id,
		Sample_type: unix.PERF_SAMPLE_RAW, Sample: 1, Wakeup: 1}
	fd, err := unix.PerfEventOpen(&attr, -1, 0, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("perf event for %s:%s: %w", group, name, err)
	}
	perf := os.NewFile(uintptr(fd), "perf-event:"+group+":"+name) // its only owner from here
	l, err := link.AttachRawLink(link.RawLinkOptions{Target: fd, Program: prog, Attach: ebpf.AttachPerfEvent})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("BPF perf link on %s:%s: %w", group, name, err), perf.Close())
	}
	return &perfLink{RawLink: l, perf: perf}, nil
}

// perfLink is a BPF perf link with the perf event fd it was made from.
type perfLink struct {
	*link.RawLink
	perf *os.File
}

// Close detaches the program and closes the perf event.
func (l *perfLink) Close() error {
	return errors.Join(l.RawLink.Close(), l.perf.Close())
}
