package workload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// streamByte is byte off of the stream every backpressure client sends:
// position-dependent, so a lost, repeated or reordered chunk is caught.
func streamByte(off int) byte {
	return byte((uint32(off) * 2654435761) >> 24)
}

func fillStream(b []byte, off int) {
	for i := range b {
		b[i] = streamByte(off + i)
	}
}

// StuckServerConfig is a server whose readers stop: each accepted connection
// reads nothing until GoFile exists (or reads at Rate bytes/s from the
// start), then reads to EOF checking the stream and answers "<bytes> ok" or
// "<bytes> bad at <offset>".
type StuckServerConfig struct {
	GoFile string // readers start when this file exists; empty: at once
	Rate   int    // bytes per second per connection; 0: as fast as possible
	Rcvbuf int    // SO_RCVBUF on the listener (inherited, locked); 0: autotuning
}

// ServeStuck accepts on ln until it is closed.
func ServeStuck(ln net.Listener, cfg StuckServerConfig) error {
	return acceptEach(ln, func(c net.Conn) {
		if err := stuckRead(c, cfg); err != nil {
			fmt.Fprintf(os.Stderr, "stuck server: %v\n", err)
		}
	})
}

// ListenStuck listens on addr with the listener's SO_RCVBUF set before
// listen (accepted sockets inherit it, and the lock).
func ListenStuck(addr string, rcvbuf int) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		if rcvbuf == 0 {
			return nil
		}
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf) })
		return errors.Join(err, serr)
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

// stuckHello opens a stuck connection: the client sends it and waits for it
// back, so the server has read with recv before the stream starts (eztunnel
// redirects only into a socket that has read, bpf/shortcut/splice.h).
const stuckHello = "hello\n"

func stuckRead(c net.Conn, cfg StuckServerConfig) error {
	hello := make([]byte, len(stuckHello))
	if _, err := io.ReadFull(c, hello); err != nil || string(hello) != stuckHello {
		return fmt.Errorf("hello: %q, %v", hello, err)
	}
	if _, err := c.Write(hello); err != nil {
		return err
	}
	for cfg.GoFile != "" {
		if _, err := os.Stat(cfg.GoFile); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	buf := make([]byte, 64<<10)
	if cfg.Rate > 0 && cfg.Rate/10 < len(buf) {
		buf = buf[:max(cfg.Rate/10, 1)]
	}
	start := time.Now()
	off, bad := 0, -1
	for {
		if cfg.Rate > 0 {
			if ahead := time.Duration(float64(off)/float64(cfg.Rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		n, err := c.Read(buf)
		for i := 0; i < n && bad < 0; i++ {
			if buf[i] != streamByte(off+i) {
				bad = off + i
			}
		}
		off += n
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	reply := fmt.Sprintf("%d ok\n", off)
	if bad >= 0 {
		reply = fmt.Sprintf("%d bad at %d\n", off, bad)
	}
	_, err := c.Write([]byte(reply))
	return err
}

// StuckClientConfig: Conns connections each write Bytes of the stream in
// Chunk-sized blocking writes, then shut down writing and check the reply.
type StuckClientConfig struct {
	Addr   string
	Conns  int
	Bytes  int
	Chunk  int
	Sndbuf int // SO_SNDBUF (locked); 0: autotuning
}

// StuckClient runs the clients and returns the first failure.
func StuckClient(cfg StuckClientConfig) error {
	var wg sync.WaitGroup
	errs := make([]error, cfg.Conns)
	for i := range cfg.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := stuckWrite(cfg); err != nil {
				errs[i] = fmt.Errorf("connection %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func stuckWrite(cfg StuckClientConfig) error {
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		if cfg.Sndbuf == 0 {
			return nil
		}
		var serr error
		err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, cfg.Sndbuf) })
		return errors.Join(err, serr)
	}}
	c, err := d.Dial("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	hello := make([]byte, len(stuckHello))
	if _, err := c.Write([]byte(stuckHello)); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, hello); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	buf := make([]byte, cfg.Chunk)
	for off := 0; off < cfg.Bytes; {
		n := min(cfg.Chunk, cfg.Bytes-off)
		fillStream(buf[:n], off)
		w, err := c.Write(buf[:n])
		off += w
		if err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reply: %w", err)
	}
	if want := fmt.Sprintf("%d ok", cfg.Bytes); strings.TrimSpace(line) != want {
		return fmt.Errorf("server read %q, want %q", strings.TrimSpace(line), want)
	}
	return nil
}
