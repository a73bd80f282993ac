package shortcut

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// The splice guard (bpf/shortcut/splice.h): a splice or sendfile from a TCP
// socket reads only its receive queue (tcp_splice_read), never bytes
// redirected into its psock, so the guard takes the socket's connection to
// the kernel path before tcp_splice_read reads. Best first: fentry on
// tcp_splice_read (runs for splices of TCP sockets only, io_uring's too;
// where the host allows fentry), the syscall events syscalls:
// sys_enter_splice and sys_enter_sendfile64 (their programs run for those
// syscalls only, but enabling any syscall event sends every syscall of the
// node through the tracing entry; perf needs their ids, which only tracefs
// tells: the host's mount, else a private one, bpfsys.TraceEventID), else
// the raw tracepoint sys_enter (its program runs for every syscall, and
// costs the node's every syscall several times what the events do:
// docs/measurements/benchmarks.md, "The splice guard's cost").
var spliceEvents = []struct{ prog, event string }{
	{shortcutProgEzScSpliceTp, "sys_enter_splice"},
	{shortcutProgEzScSendfileTp, "sys_enter_sendfile64"},
}

const spliceRawEvent = "sys_enter"

// spliceFunc is the kernel function ez_sc_splice_fe enters.
const spliceFunc = "tcp_splice_read"

// spliceFentry reports, nil or why not, whether ez_sc_splice_fe can run
// here. A test refuses it by naming the program in bpfsys.TestRefuseEnv.
func spliceFentry() error {
	if err := bpfsys.TestRefusal(shortcutProgEzScSpliceFe); err != nil {
		return err
	}
	return bpfsys.Fentry(spliceFunc)()
}

// spliceGroup is the splice-guard part. Without it, a direction still
// redirects only into a socket that has read with recvmsg (splice.h), so a
// reader that only splices gets every byte; a socket that reads with
// recvmsg first and then splices can lose the bytes redirected after.
func spliceGroup() bpfsys.Group {
	raw := bpfsys.Group{Progs: []string{shortcutProgEzScSplice},
		Via: "raw tracepoint sys_enter (runs for every syscall on the node)", Attach: spliceRawAttachable}
	events := bpfsys.Group{Via: "tracepoints syscalls:sys_enter_splice and sys_enter_sendfile64 (every syscall of the node takes the tracing entry)",
		Attach: spliceEventsAttachable, Fallback: &raw}
	for _, h := range spliceEvents {
		events.Progs = append(events.Progs, h.prog)
	}
	if err := spliceFentry(); err != nil {
		events.Via = fmt.Sprintf("%s (fentry/%s: %v)", events.Via, spliceFunc, err)
		raw.Via = fmt.Sprintf("%s (fentry/%s: %v)", raw.Via, spliceFunc, err)
		events.Part = parts.SpliceGuard
		return events
	}
	return bpfsys.Group{Part: parts.SpliceGuard, Progs: []string{shortcutProgEzScSpliceFe},
		Via: "fentry/" + spliceFunc + " (runs for splices of TCP sockets only)", Fallback: &events}
}

// spliceEventsAttachable checks prog attaches to each syscall event
// (their ids from tracefs, CONFIG_FTRACE_SYSCALLS) and detaches it.
func spliceEventsAttachable(prog *ebpf.Program) error {
	for _, h := range spliceEvents {
		l, err := bpfsys.AttachTraceEvent("syscalls", h.event, prog)
		if err != nil {
			return fmt.Errorf("attach to syscalls:%s: %w", h.event, err)
		}
		l.Close()
	}
	return nil
}

// spliceRawAttachable checks prog attaches to the raw tracepoint, and detaches it.
func spliceRawAttachable(prog *ebpf.Program) error {
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: spliceRawEvent, Program: prog})
	if err != nil {
		return fmt.Errorf("attach to raw tracepoint %s: %w", spliceRawEvent, err)
	}
	return l.Close()
}

// attachSplice attaches the splice guard's programs this load has. Over an
// earlier install's link on the same hook the new one runs beside it until
// commit (both only mark sockets and processes), then the old one is
// detached; an earlier install's links on the other hooks (or all, where
// the part is off now) are detached at commit.
func (s *Shortcut) attachSplice(tx *bpfsys.Tx) error {
	type hook struct {
		name string
		prog *ebpf.Program
		open func(*ebpf.Program) (link.Link, error)
	}
	hooks := []hook{{shortcutProgEzScSplice, s.objs.EzScSplice, func(p *ebpf.Program) (link.Link, error) {
		return link.AttachRawTracepoint(link.RawTracepointOptions{Name: spliceRawEvent, Program: p})
	}}, {shortcutProgEzScSpliceFe, s.objs.EzScSpliceFe, func(p *ebpf.Program) (link.Link, error) {
		return link.AttachTracing(link.TracingOptions{Program: p})
	}}}
	for _, h := range spliceEvents {
		hooks = append(hooks, hook{h.prog, map[string]*ebpf.Program{shortcutProgEzScSpliceTp: s.objs.EzScSpliceTp, shortcutProgEzScSendfileTp: s.objs.EzScSendfileTp}[h.prog],
			func(p *ebpf.Program) (link.Link, error) { return bpfsys.AttachTraceEvent("syscalls", h.event, p) }})
	}
	for _, h := range hooks {
		pin := bpfsys.LinkPin(s.dir, bpfsys.KindTracing, h.name)
		old, err := link.LoadPinnedLink(pin, nil)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("open pinned link %s: %w", pin, err)
		}
		if h.prog == nil {
			if old != nil {
				tx.OnCommit(func() error { return os.Remove(pin) })
				tx.OnDone(old.Close)
			}
			continue
		}
		l, err := h.open(h.prog)
		if err != nil {
			if old != nil {
				old.Close()
			}
			return fmt.Errorf("attach %s: %w", h.name, err)
		}
		s.links = append(s.links, l)
		if err := pinOver(tx, l, old, pin); err != nil {
			return err
		}
	}
	return nil
}
