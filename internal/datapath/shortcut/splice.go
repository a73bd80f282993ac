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

// spliceEvent is the raw tracepoint of the splice guard
// (bpf/shortcut/splice.h): a splice or sendfile from a TCP socket reads
// only its receive queue (tcp_splice_read), never bytes redirected into
// its psock, so the guard takes the socket's connection to the kernel path
// at the syscall's entry. The syscalls:sys_enter_splice event needs tracefs
// mounted (its id); a raw tracepoint does not.
const spliceEvent = "sys_enter"

// spliceGroup is the splice-guard part. Without it, a direction still
// redirects only into a socket that reads with recvmsg (splice.h), so a
// reader that only splices gets every byte; a socket that reads with
// recvmsg first and then splices can lose the bytes redirected before.
func spliceGroup() bpfsys.Group {
	return bpfsys.Group{Part: parts.SpliceGuard, Progs: []string{shortcutProgEzScSplice},
		Via: "raw tracepoint sys_enter (runs for every syscall on the node)", Attach: spliceAttachable}
}

// spliceAttachable checks prog attaches to its raw tracepoint, and detaches it.
func spliceAttachable(prog *ebpf.Program) error {
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: spliceEvent, Program: prog})
	if err != nil {
		return fmt.Errorf("attach to raw tracepoint %s: %w", spliceEvent, err)
	}
	return l.Close()
}

// attachSplice attaches the splice guard, where it loaded. Over an earlier
// install's link the new one runs beside it until commit (both only mark
// sockets and processes), then the old one is detached; where the part is
// off now, an earlier install's link is detached at commit.
func (s *Shortcut) attachSplice(tx *bpfsys.Tx) error {
	pin := bpfsys.LinkPin(s.dir, bpfsys.KindTracing, shortcutProgEzScSplice)
	old, err := link.LoadPinnedLink(pin, nil)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	if s.objs.EzScSplice == nil {
		if old != nil {
			tx.OnCommit(func() error { return os.Remove(pin) })
			tx.OnDone(old.Close)
		}
		return nil
	}
	l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: spliceEvent, Program: s.objs.EzScSplice})
	if err != nil {
		if old != nil {
			old.Close()
		}
		return fmt.Errorf("attach %s to raw tracepoint %s: %w", shortcutProgEzScSplice, spliceEvent, err)
	}
	s.links = append(s.links, l)
	return pinOver(tx, l, old, pin)
}
