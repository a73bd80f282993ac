package workload

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/eztunnel/eztunnel/internal/probe"
	"golang.org/x/sys/unix"
)

// A connection pool for the adoption tests: connections opened (and used)
// before the agent starts, kept, and used again after adoption. The server
// echoes every byte back; the client checks each echoed byte against the
// seeded stream it sent, so one check covers both directions. Both ends use
// Go's netpoller (non-blocking sockets and epoll), as event-loop runtimes
// do; the echo loop copies through a buffer, never io.Copy (which splices
// TCP to TCP, and splice does not see redirected bytes).

// acceptEach runs handle in its own goroutine for every connection ln
// accepts, and closes the connection when handle returns; it returns
// Accept's error (ln closed).
func acceptEach(ln net.Listener, handle func(c net.Conn)) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// ServePool echoes every connection of ln until ln is closed.
func ServePool(ln net.Listener) error {
	return acceptEach(ln, probe.Echo)
}

// ServePoolBlocking is ServePool with one thread per connection blocked in
// read(2) on a blocking socket (a RawListen socket).
func ServePoolBlocking(lfd int) error {
	for {
		fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return err
		}
		go func() {
			runtime.LockOSThread()
			defer unix.Close(fd)
			buf := make([]byte, 64<<10)
			for {
				n, err := unix.Read(fd, buf)
				if err == unix.EINTR || err == unix.EAGAIN {
					continue
				}
				if err != nil || n == 0 || writeFull(fd, buf[:n]) != nil {
					return
				}
			}
		}()
	}
}

// PoolConfig is one pool client run.
type PoolConfig struct {
	Addr    string
	Conns   int
	Rounds  int    // request/response exchanges per connection per phase
	Ready   string // file written after phase 1 (connections open and used)
	Go      string // phase 2 starts when this file exists
	Stream  bool   // phase 2 streams both ways in bursts until Stop exists
	Stop    string
	MaxGap  time.Duration // longest pause between bursts when streaming
	Seed    uint64
	Timeout time.Duration
	// FIONREAD: in phase 2 every echo but the first must show in FIONREAD
	// whole before it is read.
	FIONREAD bool
	// Unread: phase 1 ends with an echo left unread (read first in phase 2).
	Unread bool
	// Blocking: phase 2 runs each connection on a thread of its own with a
	// blocking socket: recv with SO_RCVTIMEO 1 ms in a loop (EAGAIN
	// retried after 1 ms off the socket), a request every few ms, until
	// Stop exists.
	Blocking bool
}

// PoolResult is what the client reports (JSON).
type PoolResult struct {
	Conns     int      `json:"conns"`
	BytesUp   int64    `json:"bytes_up"`   // sent in phase 2
	BytesBack int64    `json:"bytes_back"` // echoed back and checked
	SHA256Up  string   `json:"sha256_up"`  // of everything sent, all connections in order
	SHA256Bk  string   `json:"sha256_back"`
	Errors    []string `json:"errors,omitempty"`
}

// poolGen is a connection's seeded byte stream.
type poolGen struct {
	r    *rand.Rand
	tail []byte // generated, not handed out yet
}

func newPoolGen(seed uint64, conn int) *poolGen {
	return &poolGen{r: rand.New(rand.NewPCG(seed, uint64(conn)))}
}

// fill writes the stream's next len(b) bytes into b.
func (g *poolGen) fill(b []byte) {
	n := copy(b, g.tail)
	g.tail = g.tail[n:]
	for n < len(b) {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], g.r.Uint64())
		c := copy(b[n:], w[:])
		n += c
		if c < 8 {
			g.tail = append(g.tail[:0], w[c:]...)
		}
	}
}

type poolConn struct {
	c        net.Conn
	tx, rx   *poolGen
	up, back int64
	hup, hbk hashWriter
	fionread bool // before reading an echo, FIONREAD must reach its size
	// opened: an exchange ran with fionread set. The first one opens the
	// connection: until each end has read, eztunnel sends on the kernel
	// path (bpf/shortcut/splice.h), whose bytes an enrolled socket's
	// FIONREAD does not count on 6.15+ (docs/families/shortcut-design.md).
	opened bool
}

type hashWriter struct {
	w   io.Writer
	sum func() []byte
}

func newHash() hashWriter {
	h := sha256.New()
	return hashWriter{w: h, sum: func() []byte { return h.Sum(nil) }}
}

// exchange sends size bytes and checks that the same bytes come back.
func (p *poolConn) exchange(size int) error {
	out := make([]byte, size)
	p.tx.fill(out)
	if _, err := p.c.Write(out); err != nil {
		return err
	}
	p.up += int64(size)
	p.hup.w.Write(out)
	if p.fionread && p.opened {
		if err := p.waitInq(size); err != nil {
			return err
		}
	}
	p.opened = p.fionread
	return p.expect(size)
}

// waitInq polls FIONREAD until it reports want bytes (the whole echo,
// nothing read yet): plain TCP counts the receive queue, an enrolled socket
// its psock queue; a socket holding stack bytes while enrolled would stay
// at 0 (the 6.18 quirk adoption must never expose).
func (p *poolConn) waitInq(want int) error {
	rc, err := p.c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var n int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		var ierr error
		if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
			return err
		}
		if ierr != nil {
			return ierr
		}
		if n == want {
			return nil
		}
		if n > want {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	return fmt.Errorf("FIONREAD %d, want %d (the whole echo, unread)", n, want)
}

// expect reads size echoed bytes and checks them against the rx stream.
func (p *poolConn) expect(size int) error {
	got := make([]byte, size)
	if _, err := io.ReadFull(p.c, got); err != nil {
		return fmt.Errorf("after %d bytes back: %w", p.back, err)
	}
	want := make([]byte, size)
	p.rx.fill(want)
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("byte %d of the echo differs (got %#x, want %#x)", p.back+int64(i), got[i], want[i])
		}
	}
	p.back += int64(size)
	p.hbk.w.Write(got)
	return nil
}

// Pool runs the client: connect, phase 1, ready, wait for Go, phase 2.
func Pool(ctx context.Context, cfg PoolConfig) (*PoolResult, error) {
	if cfg.Conns < 1 || cfg.Rounds < 1 {
		return nil, errors.New("pool: --conns and --rounds must be at least 1")
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	conns := make([]*poolConn, cfg.Conns)
	for i := range conns {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		defer c.Close()
		conns[i] = &poolConn{c: c, tx: newPoolGen(cfg.Seed, i), rx: newPoolGen(cfg.Seed, i), hup: newHash(), hbk: newHash()}
	}
	rnd := rand.New(rand.NewPCG(cfg.Seed, 99))
	size := func(max int) int { return 8 * (1 + rnd.IntN(max/8)) }
	for _, p := range conns {
		for range cfg.Rounds {
			if err := p.exchange(size(4096)); err != nil {
				return nil, fmt.Errorf("phase 1: %w", err)
			}
		}
	}
	const unreadSize = 1000
	if cfg.Unread {
		for _, p := range conns {
			out := make([]byte, unreadSize)
			p.tx.fill(out)
			if _, err := p.c.Write(out); err != nil {
				return nil, err
			}
			p.up += unreadSize
			p.hup.w.Write(out)
		}
	}
	if cfg.Ready != "" {
		if err := os.WriteFile(cfg.Ready, []byte("ready\n"), 0o644); err != nil {
			return nil, err
		}
	}
	if cfg.Go != "" {
		if err := WaitReady(ctx, cfg.Go, cfg.Timeout, nil); err != nil {
			return nil, err
		}
	}
	res := &PoolResult{Conns: cfg.Conns}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, p := range conns {
		wg.Add(1)
		p.fionread = cfg.FIONREAD
		go func() {
			defer wg.Done()
			var err error
			if cfg.Unread {
				err = p.expect(unreadSize)
			}
			switch {
			case err != nil:
			case cfg.Blocking:
				err = p.blocking(ctx, cfg, uint64(i))
			case cfg.Stream:
				err = p.stream(ctx, cfg, uint64(i))
			default:
				r := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1000))
				for range cfg.Rounds {
					if err = p.exchange(8 * (1 + r.IntN(4096/8))); err != nil {
						break
					}
				}
			}
			if err != nil {
				mu.Lock()
				res.Errors = append(res.Errors, fmt.Sprintf("connection %d: %v", i, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	hu, hb := sha256.New(), sha256.New()
	for _, p := range conns {
		res.BytesUp += p.up
		res.BytesBack += p.back
		hu.Write(p.hup.sum())
		hb.Write(p.hbk.sum())
	}
	res.SHA256Up, res.SHA256Bk = hex.EncodeToString(hu.Sum(nil)), hex.EncodeToString(hb.Sum(nil))
	return res, nil
}

// stream writes bursts (8 B to 256 KiB) separated by pauses (0 to MaxGap)
// while a reader checks the echo, until the Stop file exists; then it
// waits for every byte to come back.
func (p *poolConn) stream(ctx context.Context, cfg PoolConfig, i uint64) error {
	r := rand.New(rand.NewPCG(cfg.Seed, i+2000))
	sent := make(chan int64, 1)
	rerr := make(chan error, 1)
	go func() {
		var total int64 = -1
		for {
			if total >= 0 && p.back >= total {
				rerr <- nil
				return
			}
			select {
			case t := <-sent:
				total = t
				continue
			default:
			}
			n := int64(64 << 10)
			if total >= 0 && total-p.back < n {
				n = total - p.back
			}
			p.c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			err := p.expectSome(int(n))
			if err != nil {
				rerr <- err
				return
			}
		}
	}()
	for {
		if _, err := os.Stat(cfg.Stop); err == nil || ctx.Err() != nil {
			break
		}
		n := 8 * (1 + r.IntN((256<<10)/8))
		out := make([]byte, n)
		p.tx.fill(out)
		if _, err := p.c.Write(out); err != nil {
			return err
		}
		p.up += int64(n)
		p.hup.w.Write(out)
		if cfg.MaxGap > 0 {
			time.Sleep(time.Duration(r.Int64N(int64(cfg.MaxGap))))
		}
	}
	sent <- p.up
	return <-rerr
}

// expectSome reads up to max echoed bytes (what is there before the read
// deadline) and checks them; a deadline with nothing read is not an error.
func (p *poolConn) expectSome(max int) error {
	got := make([]byte, max)
	n, err := p.c.Read(got)
	if n > 0 {
		want := make([]byte, n)
		p.rx.fill(want)
		for j := 0; j < n; j++ {
			if got[j] != want[j] {
				return fmt.Errorf("byte %d of the echo differs (got %#x, want %#x)", p.back+int64(j), got[j], want[j])
			}
		}
		p.back += int64(n)
		p.hbk.w.Write(got[:n])
	}
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	return err
}

// PoolPingResult: the round trips of each phase of PoolPing, in microseconds.
type PoolPingResult struct {
	Phases [][]float64 `json:"phases"`
}

// PoolPing opens conns connections to a pool server (Go's netpoller, as
// event-loop runtimes), then for each phase p waits for dir/go-<p>, sends n
// 24-byte messages per connection (round-robin, each after the previous
// echo), records the round trips and writes dir/done-<p>. Connections stay
// open between phases: the adoption benchmark adopts them in between.
func PoolPing(ctx context.Context, addr string, conns, n, phases int, dir string) (*PoolPingResult, error) {
	if conns < 1 || n < 1 || phases < 1 {
		return nil, errors.New("pool-ping: --conns, --n and --phases must be at least 1")
	}
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		cs[i] = c
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	res := &PoolPingResult{}
	msg, back := make([]byte, 24), make([]byte, 24)
	for p := range phases {
		if err := WaitReady(ctx, fmt.Sprintf("%s/go-%d", dir, p), time.Hour, nil); err != nil {
			return nil, err
		}
		rtts := make([]float64, 0, n*conns)
		for i := range n {
			for _, c := range cs {
				start := time.Now()
				binary.LittleEndian.PutUint64(msg, uint64(i))
				if _, err := c.Write(msg); err != nil {
					return nil, err
				}
				if _, err := io.ReadFull(c, back); err != nil {
					return nil, err
				}
				rtts = append(rtts, float64(time.Since(start))/float64(time.Microsecond))
				if binary.LittleEndian.Uint64(back) != uint64(i) {
					return nil, fmt.Errorf("echo of message %d came back as %d", i, binary.LittleEndian.Uint64(back))
				}
			}
		}
		res.Phases = append(res.Phases, rtts)
		if err := os.WriteFile(fmt.Sprintf("%s/done-%d", dir, p), nil, 0o644); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// blocking runs phase 2 of a Blocking pool on this goroutine's own thread,
// on a blocking dup of the socket.
func (p *poolConn) blocking(ctx context.Context, cfg PoolConfig, i uint64) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, err := p.c.(*net.TCPConn).File() // a dup, in blocking mode
	if err != nil {
		return err
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := unix.SetNonblock(fd, false); err != nil {
		return err
	}
	tv := unix.NsecToTimeval(int64(time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(cfg.Seed, i+3000))
	buf := make([]byte, 64<<10)
	var owed int // echo bytes still to come
	next := time.Now()
	for {
		stop := false
		if _, err := os.Stat(cfg.Stop); err == nil || ctx.Err() != nil {
			stop = true
		}
		if stop && owed == 0 {
			return nil
		}
		if !stop && owed == 0 && time.Now().After(next) {
			out := make([]byte, 8*(1+r.IntN(4096/8)))
			p.tx.fill(out)
			if err := writeFull(fd, out); err != nil {
				return err
			}
			p.up += int64(len(out))
			p.hup.w.Write(out)
			owed += len(out)
			next = time.Now().Add(time.Duration(r.Int64N(int64(5 * time.Millisecond))))
		}
		n, err := unix.Read(fd, buf[:max(owed, 1)])
		if err == unix.EAGAIN || err == unix.EINTR {
			// SO_RCVTIMEO, or the sockmap's spurious EAGAIN. Half the
			// time off the socket, so that rounds find it without a
			// sleeper and the next recv races the insert.
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("EOF with %d echo bytes owed", owed)
		}
		want := make([]byte, n)
		p.rx.fill(want)
		for j := range n {
			if buf[j] != want[j] {
				return fmt.Errorf("byte %d of the echo differs", p.back+int64(j))
			}
		}
		p.back += int64(n)
		p.hbk.w.Write(buf[:n])
		owed -= n
	}
}
