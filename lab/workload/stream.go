// Package workload holds the traffic generators of tests and benchmarks:
// byte-exact streams in both directions, ping-pong RTT, and an echo server.
// They run inside lab pods as `eztunnel workload ...`.
package workload

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// streamHeader opens every stream connection: what each side sends.
type streamHeader struct {
	Up    uint64 // client -> server bytes
	Down  uint64 // server -> client bytes
	Seed  uint64
	Chunk uint32 // write size of both sides
	Flags uint32 // flagNoCheck, flagHandshake
}

const (
	// flagNoCheck: send one buffer over and over and discard what arrives;
	// for throughput runs where generating and checking bytes would dominate.
	flagNoCheck = 1
	// flagHandshake: a request/response before the streams, as real
	// protocols open (the server acks the header, the client answers "go"),
	// so that each side has read all its peer sent before its stream
	// starts. eztunnel's shortcut opens a direction only then
	// (bpf/shortcut/splice.h); a pipelined stream that outruns its reader
	// from its first byte may stay on the kernel path.
	flagHandshake = 2
)

const headerLen = 32

func (h streamHeader) marshal() []byte {
	b := make([]byte, headerLen)
	binary.LittleEndian.PutUint64(b[0:], h.Up)
	binary.LittleEndian.PutUint64(b[8:], h.Down)
	binary.LittleEndian.PutUint64(b[16:], h.Seed)
	binary.LittleEndian.PutUint32(b[24:], h.Chunk)
	binary.LittleEndian.PutUint32(b[28:], h.Flags)
	return b
}

func unmarshalHeader(b []byte) streamHeader {
	return streamHeader{
		Up:    binary.LittleEndian.Uint64(b[0:]),
		Down:  binary.LittleEndian.Uint64(b[8:]),
		Seed:  binary.LittleEndian.Uint64(b[16:]),
		Chunk: binary.LittleEndian.Uint32(b[24:]),
		Flags: binary.LittleEndian.Uint32(b[28:]),
	}
}

// gen is the deterministic byte stream of one direction of one connection.
func gen(seed uint64, dir byte) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	s[8] = dir
	return rand.NewChaCha8(s)
}

// gen is the generator of one direction, nil when bytes are not checked.
func (h streamHeader) gen(dir byte) *rand.ChaCha8 {
	if h.Flags&flagNoCheck != 0 {
		return nil
	}
	return gen(h.Seed, dir)
}

// writeStream writes n bytes of the generator in chunk-sized writes (with
// g nil, the first chunk's bytes over and over).
func writeStream(w io.Writer, g *rand.ChaCha8, n uint64, chunk uint32) error {
	if chunk == 0 {
		chunk = 64 << 10
	}
	buf := make([]byte, chunk)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	for n > 0 {
		c := uint64(len(buf))
		if n < c {
			c = n
		}
		if g != nil {
			g.Read(buf[:c])
		}
		if _, err := w.Write(buf[:c]); err != nil {
			return err
		}
		n -= c
	}
	return nil
}

// ErrMismatch reports the first byte that differs from what was sent.
type ErrMismatch struct{ Offset uint64 }

func (e *ErrMismatch) Error() string { return fmt.Sprintf("stream differs at byte %d", e.Offset) }

// verifyStream reads exactly n bytes and compares them with the generator
// (with g nil, only counts them).
func verifyStream(r io.Reader, g *rand.ChaCha8, n uint64) error {
	if g == nil {
		if got, err := io.CopyN(io.Discard, r, int64(n)); err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", got, n, err)
		}
		return nil
	}
	buf := make([]byte, 64<<10)
	want := make([]byte, len(buf))
	var off uint64
	for off < n {
		c := uint64(len(buf))
		if n-off < c {
			c = n - off
		}
		if _, err := io.ReadFull(r, buf[:c]); err != nil {
			return fmt.Errorf("after %d of %d bytes: %w", off, n, err)
		}
		g.Read(want[:c])
		for i := uint64(0); i < c; i++ {
			if buf[i] != want[i] {
				return &ErrMismatch{Offset: off + i}
			}
		}
		off += c
	}
	return nil
}

// ServeStream answers stream clients until the listener closes. Each
// connection verifies the upstream and sends the downstream concurrently,
// then a 9-byte trailer: status (1 ok) and the mismatch offset.
func ServeStream(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go serveStreamConn(c)
	}
}

func serveStreamConn(c net.Conn) {
	defer c.Close()
	hb := make([]byte, headerLen)
	if _, err := io.ReadFull(c, hb); err != nil {
		return
	}
	h := unmarshalHeader(hb)
	if h.Flags&flagHandshake != 0 {
		if _, err := c.Write([]byte{1}); err != nil {
			return
		}
		if _, err := io.ReadFull(c, hb[:1]); err != nil {
			return
		}
	}
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr = writeStream(c, h.gen('d'), h.Down, h.Chunk)
	}()
	rerr := verifyStream(bufio.NewReaderSize(c, 64<<10), h.gen('u'), h.Up)
	wg.Wait()
	if werr != nil {
		return
	}
	trailer := make([]byte, 9)
	var mm *ErrMismatch
	switch {
	case rerr == nil:
		trailer[0] = 1
	case errors.As(rerr, &mm):
		binary.LittleEndian.PutUint64(trailer[1:], mm.Offset)
	}
	c.Write(trailer)
}

// StreamResult is one client connection's outcome.
type StreamResult struct {
	Conn  int    `json:"conn"`
	Error string `json:"error,omitempty"`
}

// RunStream opens one stream connection: it writes header and upstream right
// after connect, all before reading anything (but the server's ack with
// flagHandshake), then verifies downstream and the server's verdict on the
// upstream. With duplex it verifies the downstream while it writes.
func RunStream(dial func() (net.Conn, error), h streamHeader, pause func(), duplex bool) error {
	c, err := dial()
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	if _, err := c.Write(h.marshal()); err != nil {
		return fmt.Errorf("write header: %w", err)
	}
	if h.Flags&flagHandshake != 0 {
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil {
			return fmt.Errorf("read the server's ack: %w", err)
		}
		if _, err := c.Write(b); err != nil {
			return fmt.Errorf("write go: %w", err)
		}
	}
	// Pipelined: the whole upstream goes out before the first read. The
	// server reads concurrently, so this cannot deadlock.
	r := bufio.NewReaderSize(c, 64<<10)
	verify := func() error { return verifyStream(r, h.gen('d'), h.Down) }
	down := verify
	if duplex {
		done := make(chan error, 1)
		go func() { done <- verify() }()
		down = func() error { return <-done }
	}
	g := h.gen('u')
	first := h.Up
	if pause != nil {
		first = h.Up / 2 // an idle keep-alive connection: half, a pause, the rest
	}
	if err := writeStream(c, g, first, h.Chunk); err != nil {
		return fmt.Errorf("write upstream: %w", err)
	}
	if pause != nil {
		pause()
		if err := writeStream(c, g, h.Up-first, h.Chunk); err != nil {
			return fmt.Errorf("write upstream after the pause: %w", err)
		}
	}
	if err := down(); err != nil {
		return fmt.Errorf("downstream: %w", err)
	}
	trailer := make([]byte, 9)
	if _, err := io.ReadFull(r, trailer); err != nil {
		return fmt.Errorf("read server verdict: %w", err)
	}
	if trailer[0] != 1 {
		return fmt.Errorf("upstream: %w", &ErrMismatch{Offset: binary.LittleEndian.Uint64(trailer[1:])})
	}
	return nil
}

// StreamOptions describes a batch of parallel stream connections.
type StreamOptions struct {
	Addr      string
	Conns     int
	Parallel  int
	Up, Down  uint64
	Chunk     uint32
	Seed      uint64
	NoCheck   bool // throughput only: bytes are neither generated nor checked
	Handshake bool // a request/response before the streams (flagHandshake)
	// Duplex: the client reads the downstream while it writes (else only
	// after the whole upstream). Redirected bytes a reader leaves unread
	// stay in its psock, up to --max-unread; a pipelined client with a
	// large downstream would hold all of it.
	Duplex bool
	Pause  time.Duration // idle this long halfway through the upstream
	// ResumeFile, with Pause: the pause lasts until this file exists (Pause
	// then bounds it), so a test resumes the stream when it is ready.
	ResumeFile string
	// Bind, when set, is the local ip:port of every connection, bound with
	// SO_REUSEADDR and SO_REUSEPORT so that one source ip:port can reach
	// several destinations at once (connections to one destination from
	// one bound port still collide).
	Bind string
}

// dialer returns the dialer of o: plain, or bound to o.Bind.
func (o StreamOptions) dialer() (*net.Dialer, error) {
	d := &net.Dialer{}
	if o.Bind == "" {
		return d, nil
	}
	la, err := net.ResolveTCPAddr("tcp", o.Bind)
	if err != nil {
		return nil, fmt.Errorf("bind %q: %w", o.Bind, err)
	}
	d.LocalAddr = la
	d.Control = func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
	return d, nil
}

// pause is the idle time halfway through the upstream, or nil.
func (o StreamOptions) pause() func() {
	if o.Pause <= 0 {
		return nil
	}
	return func() {
		if o.ResumeFile == "" {
			time.Sleep(o.Pause)
			return
		}
		for end := time.Now().Add(o.Pause); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(o.ResumeFile); err == nil {
				return
			}
		}
	}
}

// RunStreams runs Conns connections, Parallel at a time, and returns the
// failures (nil when every byte of every connection matched).
func RunStreams(o StreamOptions) []StreamResult {
	if o.Parallel <= 0 {
		o.Parallel = o.Conns
	}
	d, err := o.dialer()
	if err != nil {
		return []StreamResult{{Conn: -1, Error: err.Error()}}
	}
	sem := make(chan struct{}, o.Parallel)
	var mu sync.Mutex
	var fails []StreamResult
	var wg sync.WaitGroup
	for i := 0; i < o.Conns; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			h := streamHeader{Up: o.Up, Down: o.Down, Seed: o.Seed + uint64(i), Chunk: o.Chunk}
			if o.NoCheck {
				h.Flags |= flagNoCheck
			}
			if o.Handshake {
				h.Flags |= flagHandshake
			}
			err := RunStream(func() (net.Conn, error) { return d.Dial("tcp", o.Addr) }, h, o.pause(), o.Duplex)
			if err != nil {
				mu.Lock()
				fails = append(fails, StreamResult{Conn: i, Error: err.Error()})
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	return fails
}

// Sink is a stream connection to the stream server, opened from the
// calling thread (a blocking socket, so the thread's CPU and network
// namespace are the stream's), measured in phases: each writes as fast as
// it can for its time, the server discarding, and ends drained (every byte
// written acknowledged), so nothing of the stream is in flight between two
// phases and a datapath can change under it without a byte overtaking
// another (bench bypass --pairs flips its switch there).
type Sink struct {
	fd  int
	buf []byte // one write's worth (the header's chunk), reused by every phase
}

// DialSink opens a Sink to addr.
func DialSink(addr string) (*Sink, error) {
	fd, err := RawDial(addr)
	if err != nil {
		return nil, err
	}
	h := streamHeader{Up: 1 << 62, Chunk: 64 << 10, Flags: flagNoCheck}
	if _, err := unix.Write(fd, h.marshal()); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("write header: %w", err)
	}
	return &Sink{fd: fd, buf: make([]byte, h.Chunk)}, nil
}

// sinkDrainMax bounds how long a phase waits for its bytes' acknowledgement.
const sinkDrainMax = 5 * time.Second

// Phase writes for d and returns the goodput, the bytes acknowledged in
// the phase (TCP_INFO's bytes_acked) over its time, in Gbit/s, and the
// segments it sent (segs_out); then waits until the send queue is empty
// (SIOCOUTQ: written and not yet acknowledged), a time not counted.
func (s *Sink) Phase(d time.Duration) (gbps float64, segs uint32, err error) {
	info0, err := unix.GetsockoptTCPInfo(s.fd, unix.SOL_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, 0, fmt.Errorf("TCP_INFO: %w", err)
	}
	start := time.Now()
	for time.Since(start) < d {
		if _, err := unix.Write(s.fd, s.buf); err != nil {
			return 0, 0, fmt.Errorf("stream: %w", err)
		}
	}
	info, err := unix.GetsockoptTCPInfo(s.fd, unix.SOL_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, 0, fmt.Errorf("TCP_INFO: %w", err)
	}
	el := time.Since(start)
	acked := info.Bytes_acked - info0.Bytes_acked
	if acked == 0 {
		return 0, 0, fmt.Errorf("stream: nothing acknowledged in %s", el)
	}
	if err := s.drain(); err != nil {
		return 0, 0, err
	}
	return float64(acked) * 8 / el.Seconds() / 1e9, info.Segs_out - info0.Segs_out, nil
}

// drain waits until every byte written is acknowledged.
func (s *Sink) drain() error {
	end := time.Now().Add(sinkDrainMax)
	for {
		n, err := unix.IoctlGetInt(s.fd, unix.SIOCOUTQ)
		if err != nil {
			return fmt.Errorf("SIOCOUTQ: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("stream: %d bytes still unacknowledged after %s", n, sinkDrainMax)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// Close closes the connection.
func (s *Sink) Close() error { return unix.Close(s.fd) }
