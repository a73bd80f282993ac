package workload

// Half-close exchanges on raw blocking sockets, many per run: `workload
// halfclose` (client) against `workload halfclose-server`. One side sends,
// shuts down writing, then reads the other's answer to EOF with blocking
// recv() calls, counting every EAGAIN (plain TCP never returns one on a
// blocking socket) and retrying it. The client prints a histogram of what
// each exchange observed (return values, byte counts, checks), which an e2e
// test compares with plain TCP; the server reports what went wrong, and its
// own EAGAINs, on stderr.
//
// Wire protocol: the server greets with "hc\n" (so the client writes after
// the server's ESTABLISHED: the connection pairs), the client sends
// "<mode> <up> <down> <delay-ms> <banner>\n", then
//   - mode c (the client half-closes): the server sends <banner> bytes, the
//     client sends up bytes and shuts down writing, then reads the banner;
//     the server reads the client's bytes to EOF, waits delay-ms, answers
//     "n=<bytes> sha=<sha256>\n" and down bytes, and closes;
//   - mode s (the server half-closes first): the server sends down bytes and
//     shuts down writing, then reads the client's answer to EOF; the client
//     reads to EOF, waits delay-ms, answers "n=<bytes> sha=<sha256>\n" and up
//     bytes, and closes.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// HalfCloseOptions configure one run of half-close exchanges.
type HalfCloseOptions struct {
	Addr       string        // server ip:port
	Mode       string        // "c": the client half-closes; "s": the server does, first
	Exchanges  int           // connections, one after the other
	Up, Down   int           // bytes client -> server and server -> client per exchange
	Delay      time.Duration // the answering side waits this long before answering ...
	DelayEvery int           // ... in every DelayEvery-th exchange (0: never)
	// Banner bytes the server sends after its greeting in mode c, which the
	// client reads only after its shutdown: its half-close then finds bytes
	// sent to it unread.
	Banner int
}

// HalfCloseReport is what the client observed.
type HalfCloseReport struct {
	Exchanges int `json:"exchanges"`
	// SpuriousEAGAIN counts EAGAINs the client's blocking reads returned;
	// MaxEAGAIN is the most one exchange saw.
	SpuriousEAGAIN int `json:"spurious_eagain"`
	MaxEAGAIN      int `json:"max_eagain_per_exchange"`
	// Observations counts exchanges by everything they observed (no timings).
	Observations map[string]int `json:"observations"`
}

const halfCloseSeed = 40

func shaHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// RunHalfClose runs o.Exchanges exchanges and reports what the client saw.
func RunHalfClose(o HalfCloseOptions) (*HalfCloseReport, error) {
	if o.Mode != "c" && o.Mode != "s" {
		return nil, fmt.Errorf("mode %q: want c (client half-closes) or s (server half-closes first)", o.Mode)
	}
	if o.Exchanges < 1 || o.Up < 0 || o.Down < 0 {
		return nil, fmt.Errorf("exchanges %d, up %d, down %d: want at least 1 exchange and no negative size", o.Exchanges, o.Up, o.Down)
	}
	rep := &HalfCloseReport{Exchanges: o.Exchanges, Observations: map[string]int{}}
	up := pattern(o.Up, halfCloseSeed)
	down := pattern(o.Down, halfCloseSeed+1)
	for i := 0; i < o.Exchanges; i++ {
		delay := time.Duration(0)
		if o.DelayEvery > 0 && i%o.DelayEvery == 0 {
			delay = o.Delay
		}
		c, err := dialHalfClose(o.Addr)
		if err != nil {
			return rep, fmt.Errorf("exchange %d: %w", i, err)
		}
		obs, err := halfCloseExchange(c, o.Mode, up, down, delay, o.Banner)
		rep.SpuriousEAGAIN += c.spurious
		rep.MaxEAGAIN = max(rep.MaxEAGAIN, c.spurious)
		c.close()
		if err != nil {
			return rep, fmt.Errorf("exchange %d: %w", i, err)
		}
		rep.Observations[obs]++
	}
	return rep, nil
}

func dialHalfClose(addr string) (*pconn, error) {
	c, err := dialRaw(addr)
	if err != nil {
		return nil, err
	}
	line, err := c.readLine()
	if err != nil || line != "hc" {
		c.close()
		return nil, fmt.Errorf("greeting %q: %v", line, err)
	}
	return c, nil
}

// dialRaw connects a blocking socket to addr (ip:port).
func dialRaw(addr string) (*pconn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	family, sa := sockaddr(ap)
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Connect(fd, sa)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("connect %s: %w", addr, err)
	}
	return &pconn{fd: fd, addr: addr}, nil
}

// halfCloseExchange runs the client's side of one exchange and returns its
// observation.
func halfCloseExchange(c *pconn, mode string, up, down []byte, delay time.Duration, banner int) (string, error) {
	if err := c.writeAll(fmt.Appendf(nil, "%s %d %d %d %d\n", mode, len(up), len(down), delay.Milliseconds(), banner)); err != nil {
		return "", err
	}
	if line, err := c.readLine(); err != nil || line != "ok" {
		return "", fmt.Errorf("header's answer %q: %v", line, err)
	}
	var f []string
	add := func(k string, v any) { f = append(f, fmt.Sprintf("%s=%v", k, v)) }
	if mode == "c" {
		if err := c.writeAll(up); err != nil {
			return "", err
		}
		add("shutdown_wr", result(0, unix.Shutdown(c.fd, unix.SHUT_WR)))
		n, err := c.send([]byte("x"), 0)
		add("write_after_shut", result(n, err))
		if banner > 0 {
			b, err := c.readFull(banner)
			add("banner", result(len(b), err))
			add("banner_ok", string(b) == string(pattern(banner, halfCloseSeed+2)))
		}
		line, err := c.readLine()
		if err != nil {
			add("server_line", errName(err))
			return strings.Join(f, " "), nil
		}
		add("server_line", strings.Replace(line, "sha="+shaHex(up), "sha=ok", 1))
		var reply []byte
		m, err := c.readToEOF(func(b []byte) { reply = append(reply, b...) })
		add("reply", result(m, err))
		add("reply_ok", string(reply) == string(down))
	} else {
		var got []byte
		m, err := c.readToEOF(func(b []byte) { got = append(got, b...) })
		add("stream", result(m, err))
		add("stream_ok", string(got) == string(down))
		time.Sleep(delay)
		err = c.writeAll(fmt.Appendf(nil, "n=%d sha=%s\n", len(got), shaHex(got)))
		add("answer_line", result(0, err))
		err = c.writeAll(up)
		add("answer", result(len(up), err))
	}
	b, err := c.recv(100, 0)
	add("read_at_eof", result(len(b), err))
	return strings.Join(f, " "), nil
}

// ServeHalfClose serves half-close clients until the process is killed,
// reporting on stderr every exchange that went wrong and every EAGAIN its
// blocking reads returned.
func ServeHalfClose(addr string, ready func() error) error {
	return serveConns(addr, ready, func(c *pconn) {
		defer c.close()
		if err := serveHalfClose(c); err != nil {
			fmt.Fprintf(os.Stderr, "halfclose-server: #%d: %v\n", c.id, err)
		}
		if c.spurious > 0 {
			fmt.Fprintf(os.Stderr, "halfclose-server: #%d: %d spurious EAGAIN on a blocking socket\n", c.id, c.spurious)
		}
	})
}

func serveHalfClose(c *pconn) error {
	if err := c.writeAll([]byte("hc\n")); err != nil {
		return err
	}
	line, err := c.readLine()
	if err != nil {
		return fmt.Errorf("header: %w", err)
	}
	var mode string
	var up, down, delayMs, banner int
	if _, err := fmt.Sscanf(line, "%s %d %d %d %d", &mode, &up, &down, &delayMs, &banner); err != nil {
		return fmt.Errorf("header %q: %w", line, err)
	}
	if err := c.writeAll([]byte("ok\n")); err != nil {
		return err
	}
	delay := time.Duration(delayMs) * time.Millisecond
	h := sha256.New()
	switch mode {
	case "c":
		if err := c.writeAll(pattern(banner, halfCloseSeed+2)); err != nil {
			return err
		}
		n, err := c.readToEOF(func(b []byte) { h.Write(b) })
		if err != nil {
			return fmt.Errorf("read the request: %s after %d bytes", errName(err), n)
		}
		time.Sleep(delay)
		if err := c.writeAll(fmt.Appendf(nil, "n=%d sha=%x\n", n, h.Sum(nil))); err != nil {
			return err
		}
		return c.writeAll(pattern(down, halfCloseSeed+1))
	case "s":
		if err := c.writeAll(pattern(down, halfCloseSeed+1)); err != nil {
			return err
		}
		if err := unix.Shutdown(c.fd, unix.SHUT_WR); err != nil {
			return fmt.Errorf("shutdown: %s", errName(err))
		}
		before := c.spurious
		defer func() {
			if n := c.spurious - before; n > 0 {
				fmt.Fprintf(os.Stderr, "halfclose-server: #%d: %d of the spurious EAGAINs after its own shutdown(SHUT_WR)\n", c.id, n)
			}
		}()
		line, err := c.readLine()
		if err != nil {
			return fmt.Errorf("read the answer line: %s", errName(err))
		}
		want := pattern(up, halfCloseSeed)
		n, err := c.readToEOF(func(b []byte) { h.Write(b) })
		if err != nil {
			return fmt.Errorf("read the answer: %s after %d bytes", errName(err), n)
		}
		if n != up || hex.EncodeToString(h.Sum(nil)) != shaHex(want) {
			return fmt.Errorf("answer: %d bytes, want %d, sha mismatch %v", n, up, hex.EncodeToString(h.Sum(nil)) != shaHex(want))
		}
		if !strings.HasPrefix(line, "n="+strconv.Itoa(down)+" sha="+shaHex(pattern(down, halfCloseSeed+1))) {
			return fmt.Errorf("the client saw %q, want n=%d and the stream's sha", line, down)
		}
		return nil
	}
	return fmt.Errorf("mode %q", mode)
}
