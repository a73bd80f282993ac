package workload

// The socket semantics probe: one connection per scenario between
// `workload probe` (client) and `workload probe-server`, both on raw blocking
// sockets so every result is exactly what the system call returned. The
// client prints an Observation; an e2e test compares it between plain TCP and
// the accelerated datapath.
//
// Wire protocol: the server greets every accepted connection with
// "ez <id>\n" (so the client's first byte is sent after the server's
// ESTABLISHED, and the pairing is decided before any client data), the client
// answers with the scenario name on one line, then both run the scenario's
// halves. "drain <id>" on a second connection releases a server waiting in
// nonblock_eagain.

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Observation is what a probe scenario saw: return values, errno names, byte
// counts and booleans only, never timings. JSON encodes it with sorted keys.
type Observation map[string]any

// Scenarios lists the probe scenario names, sorted.
func Scenarios() []string {
	names := make([]string, 0, len(scenarios))
	for n := range scenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type scenario struct {
	// client runs the client half after the scenario name was sent.
	client func(c *pconn, o Observation) error
	// server runs the server half after the name was read. The connection
	// is then read until EOF and closed, unless server closed it (fd -1).
	server func(c *pconn) error
}

// settle is the pause after poll says readable, so every byte sent in one
// go has arrived.
const settle = 50 * time.Millisecond

// SpuriousEAGAINField is the observation of how many EAGAINs the client's
// blocking read loops retried.
const SpuriousEAGAINField = "spurious_eagain"

// pconn is a TCP socket, blocking unless nonblock.
type pconn struct {
	fd       int
	id       uint64 // the server's id of this connection
	addr     string // client: the server's address, for the drain connection
	nonblock bool
	// spurious counts EAGAINs of blocking reads in the read loops (readFull,
	// readLine, readToEOF), which retry them. Plain TCP never returns EAGAIN
	// on a blocking socket; the recv_wakeup scenario shows when tcp_bpf does,
	// and the loops retry so that other scenarios measure what they are about.
	spurious int
}

func (c *pconn) setNonblock(on bool) error {
	if err := unix.SetNonblock(c.fd, on); err != nil {
		return err
	}
	c.nonblock = on
	return nil
}

// loopRecv is recv for the read loops: on a blocking socket it retries a
// spurious EAGAIN, counted.
func (c *pconn) loopRecv(n int) ([]byte, error) {
	for {
		b, err := c.recv(n, 0)
		if err != unix.EAGAIN || c.nonblock || c.spurious >= 10000 {
			return b, err
		}
		c.spurious++
		time.Sleep(time.Millisecond)
	}
}

func (c *pconn) close() {
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// errName is the errno name of err ("EAGAIN"), else its text.
func errName(err error) string {
	var en unix.Errno
	if errors.As(err, &en) {
		if n := unix.ErrnoName(en); n != "" {
			return n
		}
	}
	return err.Error()
}

// result is n, or the errno name when err is set.
func result(n int, err error) any {
	if err != nil {
		return errName(err)
	}
	return n
}

func (c *pconn) recv(n, flags int) ([]byte, error) {
	b := make([]byte, n)
	for {
		m, _, err := unix.Recvfrom(c.fd, b, flags)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		return b[:m], nil
	}
}

func (c *pconn) send(b []byte, flags int) (int, error) {
	for {
		n, err := unix.SendmsgN(c.fd, b, nil, nil, flags|unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

func (c *pconn) writeAll(b []byte) error {
	for len(b) > 0 {
		n, err := c.send(b, 0)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// readFull reads exactly n bytes; io.ErrUnexpectedEOF-like on early EOF.
func (c *pconn) readFull(n int) ([]byte, error) {
	out := make([]byte, 0, n)
	for len(out) < n {
		b, err := c.loopRecv(n - len(out))
		if err != nil {
			return out, err
		}
		if len(b) == 0 {
			return out, fmt.Errorf("EOF after %d of %d bytes", len(out), n)
		}
		out = append(out, b...)
	}
	return out, nil
}

// readLine reads one '\n'-terminated line a byte at a time, so nothing after
// it is consumed.
func (c *pconn) readLine() (string, error) {
	var line []byte
	for len(line) < 256 {
		b, err := c.loopRecv(1)
		if err != nil {
			return string(line), err
		}
		if len(b) == 0 {
			return string(line), fmt.Errorf("EOF in line %q", line)
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
	return string(line), fmt.Errorf("line too long")
}

// readToEOF reads until EOF, feeding fn, and returns the byte count.
func (c *pconn) readToEOF(fn func([]byte)) (int, error) {
	total := 0
	for {
		b, err := c.loopRecv(64 << 10)
		if err != nil {
			return total, err
		}
		if len(b) == 0 {
			return total, nil
		}
		if fn != nil {
			fn(b)
		}
		total += len(b)
	}
}

// poll returns the revents of one poll(2) call on the socket (0 on timeout).
func (c *pconn) poll(events int16, timeoutMs int) int16 {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: events}}
	for {
		n, err := unix.Poll(fds, timeoutMs)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0
		}
		return fds[0].Revents
	}
}

// waitIn waits until the socket is readable, then lets the rest arrive.
func (c *pconn) waitIn() {
	c.poll(unix.POLLIN, 5000)
	time.Sleep(settle)
}

func (c *pconn) inq() any {
	n, err := unix.IoctlGetInt(c.fd, unix.SIOCINQ)
	return result(n, err)
}

var pollBits = []struct {
	bit  int16
	name string
}{
	{unix.POLLIN, "IN"}, {unix.POLLPRI, "PRI"}, {unix.POLLOUT, "OUT"},
	{unix.POLLRDHUP, "RDHUP"}, {unix.POLLERR, "ERR"}, {unix.POLLHUP, "HUP"},
	{unix.POLLNVAL, "NVAL"},
}

// pollNames spells revents as "IN|OUT", or "0".
func pollNames(rev int16) string {
	var s []string
	for _, b := range pollBits {
		if rev&b.bit != 0 {
			s = append(s, b.name)
			rev &^= b.bit
		}
	}
	if rev != 0 {
		s = append(s, fmt.Sprintf("%#x", uint16(rev)))
	}
	if len(s) == 0 {
		return "0"
	}
	return strings.Join(s, "|")
}

// pattern is n deterministic bytes of a seed.
func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	gen(seed, 'p').Read(b)
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// drains releases server connections waiting for the client's "drain <id>".
var drains = struct {
	sync.Mutex
	m map[uint64]chan struct{}
}{m: map[uint64]chan struct{}{}}

func drainChan(id uint64) chan struct{} {
	drains.Lock()
	defer drains.Unlock()
	ch, ok := drains.m[id]
	if !ok {
		ch = make(chan struct{})
		drains.m[id] = ch
	}
	return ch
}

// releaseDrain closes id's channel; it stays in the map, closed, so a
// server that asks for it later does not wait.
func releaseDrain(id uint64) {
	ch := drainChan(id)
	drains.Lock()
	defer drains.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// listenProbe listens on host:port; an empty host is dual-stack [::].
func listenProbe(addr string) (int, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return -1, fmt.Errorf("address %q: want host:port", addr)
	}
	host, portStr := addr[:i], addr[i+1:]
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return -1, fmt.Errorf("address %q: %w", addr, err)
	}
	ip := netip.IPv6Unspecified()
	if host = strings.Trim(host, "[]"); host != "" {
		if ip, err = netip.ParseAddr(host); err != nil {
			return -1, err
		}
	}
	family, sa := sockaddr(netip.AddrPortFrom(ip, uint16(port)))
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if family == unix.AF_INET6 {
		unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func sockaddr(ap netip.AddrPort) (int, unix.Sockaddr) {
	if ap.Addr().Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// ServeProbe listens on addr, calls ready once listening, and serves probe
// clients until the process is killed.
func ServeProbe(addr string, ready func() error) error {
	return serveConns(addr, ready, serveProbeConn)
}

// serveConns listens on addr with a blocking socket, calls ready once
// listening, and serves each accepted connection (numbered from 1) in its
// own goroutine until the process is killed.
func serveConns(addr string, ready func() error, serve func(*pconn)) error {
	lfd, err := listenProbe(addr)
	if err != nil {
		return err
	}
	if err := ready(); err != nil {
		return err
	}
	var next atomic.Uint64
	for {
		fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		go serve(&pconn{fd: fd, id: next.Add(1)})
	}
}

func serveProbeConn(c *pconn) {
	defer c.close()
	if err := c.writeAll(fmt.Appendf(nil, "ez %d\n", c.id)); err != nil {
		return
	}
	line, err := c.readLine()
	if err != nil {
		return
	}
	name, arg, _ := strings.Cut(line, " ")
	if name == "drain" {
		if id, err := strconv.ParseUint(arg, 10, 64); err == nil {
			releaseDrain(id)
		}
		return
	}
	sc, ok := scenarios[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "probe-server: unknown scenario %q\n", name)
		return
	}
	// Each end has now read all the other sent (greeting, name, this
	// line) with recv: eztunnel redirects into a socket only from then on
	// (bpf/shortcut/splice.h), so the scenario runs on the shortcut.
	if err := c.writeAll([]byte(probeGo + "\n")); err != nil {
		return
	}
	if err := sc.server(c); err != nil {
		fmt.Fprintf(os.Stderr, "probe-server: %s #%d: %v\n", name, c.id, err)
	}
	if c.fd >= 0 {
		c.readToEOF(nil)
	}
	if c.spurious > 0 {
		fmt.Fprintf(os.Stderr, "probe-server: %s #%d: %d spurious EAGAIN on a blocking socket\n", name, c.id, c.spurious)
	}
}

// probeGo is the server's answer to a scenario's name: the scenario starts.
const probeGo = "go"

// dialProbe connects to addr (ip:port) and reads the server's greeting.
func dialProbe(addr string) (*pconn, error) {
	c, err := dialRaw(addr)
	if err != nil {
		return nil, err
	}
	line, err := c.readLine()
	if err != nil {
		c.close()
		return nil, fmt.Errorf("greeting: %w", err)
	}
	if _, err := fmt.Sscanf(line, "ez %d", &c.id); err != nil {
		c.close()
		return nil, fmt.Errorf("greeting %q: %w", line, err)
	}
	return c, nil
}

// RunProbe runs one scenario against the probe server at addr (ip:port).
func RunProbe(addr, name string) (Observation, error) {
	sc, ok := scenarios[name]
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q (have %s)", name, strings.Join(Scenarios(), ", "))
	}
	c, err := dialProbe(addr)
	if err != nil {
		return nil, err
	}
	defer c.close()
	if err := c.writeAll([]byte(name + "\n")); err != nil {
		return nil, fmt.Errorf("send scenario: %w", err)
	}
	if line, err := c.readLine(); err != nil || line != probeGo {
		return nil, fmt.Errorf("scenario %s not started: %q, %v", name, line, err)
	}
	o := Observation{}
	err = sc.client(c, o)
	// Observed, so the comparison with plain TCP (always 0) checks it.
	o[SpuriousEAGAINField] = c.spurious
	if err != nil {
		return o, fmt.Errorf("%s: %w", name, err)
	}
	return o, nil
}
