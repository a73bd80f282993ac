// Package probe is the connectivity probe `kubectl eztunnel connectivity`
// runs in its pods (`eztunnel probe`): a client that checks every byte an
// echo server sends back and tells, from its socket's TCP counters alone,
// whether the bytes took the shortcut. It needs no privilege and no agent.
package probe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// Result is one connection of `eztunnel probe check`.
type Result struct {
	Addr  string `json:"addr"`
	Bytes int    `json:"bytes"` // sent, and echoed back
	// Exact: every byte came back, in order.
	Exact bool   `json:"exact"`
	Error string `json:"error,omitempty"`
	// The kernel's TCP counters of the client's socket (TCP_INFO): bytes
	// the peer acknowledged and bytes received as TCP segments. On the
	// shortcut the payload never becomes segments, so both stay near 0.
	TCPBytesAcked    uint64 `json:"tcp_bytes_acked"`
	TCPBytesReceived uint64 `json:"tcp_bytes_received"`
	Accelerated      bool   `json:"accelerated"`
}

// Check exchanges one byte, then sends size random bytes on the same
// connection, reads them back and compares; the socket's TCP_INFO is read
// before it closes.
func Check(ctx context.Context, addr string, size int) Result {
	r := Result{Addr: addr, Bytes: size}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	// A one-byte exchange first, as a request/response client starts: the
	// connection is set up at both ends before the bulk (bytes sent before
	// the server's end exists take the kernel path, and later ones wait
	// for them to be read, in order).
	one := []byte{'?'}
	if _, err := c.Write(one); err != nil {
		r.Error = err.Error()
		return r
	}
	if _, err := io.ReadFull(c, one); err != nil {
		r.Error = err.Error()
		return r
	}
	out := make([]byte, size)
	for i := range out {
		out[i] = byte(rand.Uint32())
	}
	werr := make(chan error, 1)
	go func() {
		// In chunks, as a stream is written: the reader keeps up.
		const chunk = 64 << 10
		for off := 0; off < size; off += chunk {
			if _, err := c.Write(out[off:min(off+chunk, size)]); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	in := make([]byte, size)
	_, rerr := io.ReadFull(c, in)
	if err := errors.Join(<-werr, rerr); err != nil {
		r.Error = err.Error()
		return r
	}
	r.Exact = bytes.Equal(in, out)
	if sc, ok := c.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			raw.Control(func(fd uintptr) {
				if ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
					r.TCPBytesAcked, r.TCPBytesReceived = ti.Bytes_acked, ti.Bytes_received
				}
			})
		}
	}
	// Half the bytes as segments either way: the connection left or never
	// took the shortcut.
	r.Accelerated = r.TCPBytesAcked < uint64(size/2) && r.TCPBytesReceived < uint64(size/2)
	return r
}

// Echo writes back what it reads with a buffer of its own until the
// connection ends: io.Copy from a TCP connection to one splices (Go's
// TCPConn.ReadFrom), and a connection whose reader splices leaves the
// shortcut (fallback_splice), so an echo server written with io.Copy would
// never be accelerated.
func Echo(c net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
