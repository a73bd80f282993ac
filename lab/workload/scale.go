package workload

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ServeManyEcho accepts on the listening socket lfd and echoes every byte of
// every connection, from one thread with epoll: no goroutine, stack or
// buffer per connection, so one process holds as many connections as its
// descriptor limit allows (`bench scale`). A write the socket cannot take
// whole stops reading that connection until the rest is out.
func ServeManyEcho(lfd int) error {
	if err := unix.SetNonblock(lfd, true); err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	watch := func(fd int, op int, events uint32) error {
		return unix.EpollCtl(ep, op, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
	}
	if err := watch(lfd, unix.EPOLL_CTL_ADD, unix.EPOLLIN); err != nil {
		return err
	}
	events := make([]unix.EpollEvent, 512)
	buf := make([]byte, 64<<10)
	pending := map[int][]byte{} // unwritten echo of a connection
	closeConn := func(fd int) {
		delete(pending, fd)
		unix.Close(fd) // leaves the epoll set with its last descriptor
	}
	for {
		n, err := unix.EpollWait(ep, events, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				if err := acceptAll(lfd, func(c int) error { return watch(c, unix.EPOLL_CTL_ADD, unix.EPOLLIN) }); err != nil {
					return err
				}
				continue
			}
			if rest, ok := pending[fd]; ok {
				m, err := unix.Write(fd, rest)
				switch {
				case err == unix.EAGAIN:
				case err != nil:
					closeConn(fd)
				case m < len(rest):
					pending[fd] = rest[m:]
				default:
					delete(pending, fd)
					watch(fd, unix.EPOLL_CTL_MOD, unix.EPOLLIN)
				}
				continue
			}
			m, err := unix.Read(fd, buf)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil || m == 0 {
				closeConn(fd)
				continue
			}
			w, err := unix.Write(fd, buf[:m])
			if err == unix.EAGAIN {
				w, err = 0, nil
			}
			if err != nil {
				closeConn(fd)
				continue
			}
			if w < m {
				pending[fd] = bytes.Clone(buf[w:m])
				watch(fd, unix.EPOLL_CTL_MOD, unix.EPOLLOUT)
			}
		}
	}
}

// acceptAll accepts every connection queued on the non-blocking lfd and
// hands each to add; running out of descriptors is an error (the caller
// sized the process for its share).
func acceptAll(lfd int, add func(fd int) error) error {
	for {
		fd, _, err := unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		switch {
		case err == unix.EAGAIN:
			return nil
		case err == unix.EINTR || err == unix.ECONNABORTED:
			continue
		case err != nil:
			return fmt.Errorf("accept: %w", err)
		}
		if err := add(fd); err != nil {
			unix.Close(fd)
			return err
		}
	}
}

// ScaleHolder holds connections to a ServeManyEcho server and checks rounds
// of messages on them: each message is unique to its connection and round,
// and must come back byte for byte.
type ScaleHolder struct {
	conns    []net.Conn
	base     uint64 // the first connection's id; ids are base+index
	size     int
	parallel int
	round    uint64
	sent     []bool // connections whose message of this round is out
}

// ScaleRound is one round's outcome in one holder.
type ScaleRound struct {
	Round      uint64  `json:"round"`
	Conns      int     `json:"conns"` // connections checked
	Bytes      uint64  `json:"bytes"` // bytes that came back exactly
	Mismatches int     `json:"mismatches"`
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	Seconds    float64 `json:"seconds"`
}

// OpenScale opens n connections to addr, parallel at once, and checks a
// hello (the connection's id) echoed on each: every connection has been
// established and used in both directions when it returns. The first
// failure ends it, so a holder that cannot get its share says why at once.
func OpenScale(ctx context.Context, addr string, n int, base uint64, size, parallel int) (*ScaleHolder, error) {
	if size < 16 {
		return nil, fmt.Errorf("message size %d: at least 16 (the id and the round)", size)
	}
	h := &ScaleHolder{conns: make([]net.Conn, n), base: base, size: size, parallel: max(parallel, 1), sent: make([]bool, n)}
	// No keep-alive probes: Go's default (every 15 s) would send a million
	// idle connections' probes through the node's stack, tens of thousands
	// a second, and the bench would measure them.
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: -1}
	err := h.each(ctx, true, func(i int) error {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		h.conns[i] = c
		hello := binary.LittleEndian.AppendUint64(nil, h.base+uint64(i))
		return exchange(c, hello, 30*time.Second)
	})
	if err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Close closes every connection.
func (h *ScaleHolder) Close() {
	for _, c := range h.conns {
		if c != nil {
			c.Close()
		}
	}
}

// each runs fn on every connection index, parallel at once; with failFast
// the first error stops it and is returned, else errors are fn's to count.
func (h *ScaleHolder) each(ctx context.Context, failFast bool, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range min(h.parallel, len(h.conns)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(h.conns) || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil && failFast {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("connection %d of %d: %w", i, len(h.conns), err)
					}
					mu.Unlock()
					next.Store(int64(len(h.conns)))
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// message is connection id's message of round r: the id, the round, then
// bytes of an xorshift stream seeded by both.
func (h *ScaleHolder) message(id uint64) []byte {
	b := binary.LittleEndian.AppendUint64(nil, id)
	b = binary.LittleEndian.AppendUint64(b, h.round)
	x := id*0x9e3779b97f4a7c15 ^ (h.round+1)*0xbf58476d1ce4e5b9 | 1
	for len(b) < h.size {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b = append(b, byte(x))
	}
	return b[:h.size]
}

// Send writes this round's message on every every-th connection and
// leaves the echoes unread (Check reads them); a write error is Check's
// to report.
func (h *ScaleHolder) Send(ctx context.Context, every int) {
	every = max(every, 1)
	h.each(ctx, false, func(i int) error {
		if i%every != 0 || h.sent[i] {
			return nil
		}
		h.conns[i].SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := h.conns[i].Write(h.message(h.base + uint64(i))); err != nil {
			return err
		}
		h.sent[i] = true
		return nil
	})
}

// Check reads back this round's message on every connection it was sent
// on, compares it, and starts the next round. If nothing was sent (no Send
// this round), each connection sends its message and reads it back in
// turn, so that at most parallel messages are queued at once: a message
// queued on every one of a million sockets would take a page of TCP memory
// each, past net.ipv4.tcp_mem.
func (h *ScaleHolder) Check(ctx context.Context, timeout time.Duration) ScaleRound {
	start := time.Now()
	exchange := !slices.Contains(h.sent, true)
	r := ScaleRound{Round: h.round}
	var mu sync.Mutex
	var checked, good, mismatched, failed atomic.Int64
	h.each(ctx, false, func(i int) error {
		if !h.sent[i] && !exchange {
			return nil
		}
		checked.Add(1)
		want := h.message(h.base + uint64(i))
		var err error
		if exchange {
			h.conns[i].SetWriteDeadline(time.Now().Add(timeout))
			_, err = h.conns[i].Write(want)
		}
		got := make([]byte, len(want))
		if err == nil {
			h.conns[i].SetReadDeadline(time.Now().Add(timeout))
			_, err = io.ReadFull(h.conns[i], got)
		}
		switch {
		case err != nil:
			failed.Add(1)
			mu.Lock()
			if r.FirstError == "" {
				r.FirstError = fmt.Sprintf("connection %d: %v", i, err)
			}
			mu.Unlock()
		case !bytes.Equal(got, want):
			mismatched.Add(1)
			mu.Lock()
			if r.FirstError == "" {
				r.FirstError = fmt.Sprintf("connection %d: got %x, want %x", i, got, want)
			}
			mu.Unlock()
		default:
			good.Add(1)
		}
		return nil
	})
	r.Conns, r.Mismatches, r.Errors = int(checked.Load()), int(mismatched.Load()), int(failed.Load())
	r.Bytes = uint64(good.Load()) * uint64(h.size) * 2 // each way
	if err := ctx.Err(); err != nil && r.FirstError == "" {
		r.FirstError = err.Error()
	}
	r.Seconds = time.Since(start).Seconds()
	h.round++
	clear(h.sent)
	return r
}

// exchange writes msg and reads it back, within timeout.
func exchange(c net.Conn, msg []byte, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo differs from the hello")
	}
	return nil
}
