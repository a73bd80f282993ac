package e2e

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

// TestKernelBackpressure is the kernel's own behaviour, without eztunnel:
// a socket whose sk_msg program redirects every message into its peer's
// receive queue (BPF_F_INGRESS), the peer with a small SO_RCVBUF and not
// reading. It checks that the agent's probe (shortcut.KernelBackpressure)
// tells the truth about this kernel:
//   - with the change of kernel/patches, the sender is held as a TCP sender
//     is (the same checks as the patch's selftest): EAGAIN once the receiver
//     holds more than its sk_rcvbuf, within one send; FIONREAD counts every
//     byte; no POLLOUT; SO_SNDTIMEO times out; a blocked sender is woken by
//     the reader's drain and its bytes arrive;
//   - without it, the sender is never held: 16 times the receive buffer is
//     accepted (why the shortcut has its unread bound,
//     docs/families/shortcut-design.md, Backpressure).
func TestKernelBackpressure(t *testing.T) {
	probe := shortcut.KernelBackpressure()
	t.Logf("the agent's probe: %v", errOr(probe, "kernel backpressure found"))

	sockmap, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockMap, KeySize: 4, ValueSize: 4, MaxEntries: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer sockmap.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SkMsg, License: "GPL",
		Instructions: asm.Instructions{
			// bpf_msg_redirect_map(msg, sockmap, 1, BPF_F_INGRESS)
			asm.LoadMapPtr(asm.R2, sockmap.FD()),
			asm.Mov.Imm(asm.R3, 1),
			asm.Mov.Imm(asm.R4, 1),
			asm.FnMsgRedirectMap.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: sockmap.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
		t.Fatal(err)
	}
	defer link.RawDetachProgram(link.RawDetachProgramOptions{Target: sockmap.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict})

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cconn, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cconn.Close()
	pconn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close()
	// Raw descriptors, blocking as the selftest's: dup'd out of the runtime's poller.
	c, p := rawFD(t, cconn), rawFD(t, pconn)
	if err := unix.SetsockoptInt(p, unix.SOL_SOCKET, unix.SO_RCVBUF, 16384); err != nil {
		t.Fatal(err)
	}
	rcvbuf, err := unix.GetsockoptInt(p, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		t.Fatal(err)
	}
	if err := sockmap.Update(uint32(0), uint32(c), ebpf.UpdateNoExist); err != nil {
		t.Fatal(err)
	}
	if err := sockmap.Update(uint32(1), uint32(p), ebpf.UpdateNoExist); err != nil {
		t.Fatal(err)
	}

	buf := make([]byte, 4096)
	total, sendErr := 0, error(nil)
	for total <= 16*rcvbuf {
		n, err := unix.SendmsgN(c, buf, nil, nil, unix.MSG_DONTWAIT)
		if err != nil {
			sendErr = err
			break
		}
		total += n
	}
	t.Logf("receiver sk_rcvbuf %d: the sender queued %d bytes, then %v", rcvbuf, total, sendErr)
	avail, err := unix.IoctlGetInt(p, unix.SIOCINQ)
	if err != nil {
		t.Fatal(err)
	}
	if avail != total {
		t.Errorf("FIONREAD %d, want every byte queued (%d)", avail, total)
	}

	if probe != nil {
		if sendErr != nil {
			t.Fatalf("the probe found no kernel backpressure, but the kernel held the sender after %d bytes: %v", total, sendErr)
		}
		return
	}
	if !errors.Is(sendErr, unix.EAGAIN) {
		t.Fatalf("the probe found kernel backpressure, but %d bytes (16 receive buffers) were accepted: %v", total, sendErr)
	}
	if total <= rcvbuf || total > rcvbuf+len(buf) {
		t.Errorf("the sender stopped after %d bytes, want within one send past sk_rcvbuf %d", total, rcvbuf)
	}
	fds := []unix.PollFd{{Fd: int32(c), Events: unix.POLLOUT}}
	if n, err := unix.Poll(fds, 0); err != nil || n != 0 {
		t.Errorf("poll: %d ready (%v), want no POLLOUT while the receiver is full", n, err)
	}
	if err := unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Usec: 100000}); err != nil {
		t.Fatal(err)
	}
	send := func() (int, error) { return unix.Write(c, buf) }
	if _, err := retryingEINTR(send); !errors.Is(err, unix.EAGAIN) {
		t.Errorf("a blocking send with SO_SNDTIMEO returned %v, want EAGAIN after the timeout", err)
	}
	if err := unix.SetsockoptTimeval(c, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: int64(scaled(10*time.Second) / time.Second)}); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() { _, err := retryingEINTR(send); sent <- err }()
	select {
	case err := <-sent:
		t.Fatalf("a blocking send into a full receiver returned at once: %v", err)
	case <-time.After(scaled(100 * time.Millisecond)):
	}
	for got := 0; got < total; {
		n, _, err := unix.Recvfrom(p, buf, unix.MSG_DONTWAIT)
		if err != nil || n <= 0 {
			t.Fatalf("drain: %d bytes of %d, then %d, %v", got, total, n, err)
		}
		got += n
	}
	if err := <-sent; err != nil {
		t.Fatalf("the blocked sender, woken by the drain: %v", err)
	}
	if n, err := retryingEINTR(func() (int, error) { return unix.Poll(fds, int(scaled(time.Second)/time.Millisecond)) }); err != nil || n != 1 {
		t.Errorf("poll after the drain: %d ready (%v), want POLLOUT", n, err)
	}
	if n, err := unix.Read(p, buf); err != nil || n != len(buf) {
		t.Errorf("read of the woken sender's bytes: %d, %v", n, err)
	}
}

// retryingEINTR calls fn again while it fails with EINTR. The test
// process's own signals (the Go runtime's preemption, SIGCHLD of the
// suite's processes) interrupt blocking calls: a send with SO_SNDTIMEO set
// is not restarted (sock_intr_errno), nor is poll(2) (signal(7)); plain TCP
// the same. Under TCG a send was.
func retryingEINTR(fn func() (int, error)) (int, error) {
	for {
		n, err := fn()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// rawFD returns a blocking duplicate of conn's socket (closed at cleanup).
func rawFD(t *testing.T, conn net.Conn) int {
	t.Helper()
	f, err := conn.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fd := int(f.Fd()) // File() dup's the socket; Fd() makes it blocking
	return fd
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}
