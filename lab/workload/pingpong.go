package workload

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/eztunnel/eztunnel/internal/stats"
	"golang.org/x/sys/unix"
)

// The ping-pong path uses blocking sockets outside Go's netpoller: a reader
// sleeps in recv and the kernel wakes its thread directly, as in a C client.
// That keeps the generator's own overhead small next to what it measures.

// parseSockaddr parses "unix:/path" or "host:port".
func parseSockaddr(addr string) (int, unix.Sockaddr, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return unix.AF_UNIX, &unix.SockaddrUnix{Name: p}, nil
	}
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return 0, nil, err
	}
	if ip4 := ta.IP.To4(); ip4 != nil && !strings.HasPrefix(addr, "[") {
		sa := &unix.SockaddrInet4{Port: ta.Port}
		copy(sa.Addr[:], ip4)
		return unix.AF_INET, sa, nil
	}
	sa := &unix.SockaddrInet6{Port: ta.Port}
	copy(sa.Addr[:], ta.IP.To16())
	return unix.AF_INET6, sa, nil
}

func rawSocket(family int) (int, error) {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if family != unix.AF_UNIX {
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	return fd, nil
}

// RawDial connects a blocking stream socket to addr.
func RawDial(addr string) (int, error) {
	family, sa, err := parseSockaddr(addr)
	if err != nil {
		return -1, err
	}
	fd, err := rawSocket(family)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s: %w", addr, err)
	}
	return fd, nil
}

// RawListen opens a blocking listening socket on addr.
func RawListen(addr string) (int, error) {
	family, sa, err := parseSockaddr(addr)
	if err != nil {
		return -1, err
	}
	if u, ok := sa.(*unix.SockaddrUnix); ok {
		unix.Unlink(u.Name)
	}
	fd, err := rawSocket(family)
	if err != nil {
		return -1, err
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", addr, err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// SpuriousEAGAIN counts EAGAINs returned by reads of these blocking sockets.
// Plain TCP never returns them; the kernel's sockmap receive path does when
// the sleeping reader is woken without data, by a signal (Go's preemption
// sends SIGURG) or a state change (tcp_msg_wait_data). The generators retry
// and report the count instead of failing (see docs/families/shortcut-design.md).
var SpuriousEAGAIN atomic.Int64

func readFull(fd int, b []byte) error {
	for off := 0; off < len(b); {
		n, err := unix.Read(fd, b[off:])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			SpuriousEAGAIN.Add(1)
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("connection closed after %d of %d bytes", off, len(b))
		}
		off += n
	}
	return nil
}

func writeFull(fd int, b []byte) error {
	for off := 0; off < len(b); {
		n, err := unix.Write(fd, b[off:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		off += n
	}
	return nil
}

// ServeEcho answers ping-pong clients on a RawListen socket: a 4-byte
// message size, then each message of that size is echoed back whole.
func ServeEcho(lfd int) error {
	for {
		fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return err
		}
		go echoConn(fd)
	}
}

func echoConn(fd int) {
	// Unlocked at the end, so that the thread goes back to the runtime's
	// pool: a goroutine that exits locked ends its thread, whose run time
	// then leaves /proc/<pid>/task, where bench scale sums the server's
	// CPU time (the handler of each phase's connection vanished with it).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer unix.Close(fd)
	var hb [4]byte
	if readFull(fd, hb[:]) != nil {
		return
	}
	buf := make([]byte, binary.LittleEndian.Uint32(hb[:]))
	for readFull(fd, buf) == nil && writeFull(fd, buf) == nil {
	}
}

// PingPong sends n messages of size bytes (after warmup unrecorded ones)
// on a RawDial socket, each after the previous echo returned, and returns
// the round-trip times.
func PingPong(fd, size, n, warmup int) ([]time.Duration, error) {
	return PingPongPaced(fd, size, n, warmup, 0)
}

// PingPongPaced is PingPong with the sends paced: message i leaves at
// start + i*interval (or at once when the previous echo came back later),
// as the dissertation's ping-echo client sends one message every 100 ms.
// Each message carries its send timestamp, which the echo must return.
func PingPongPaced(fd, size, n, warmup int, interval time.Duration) ([]time.Duration, error) {
	return PingPongUntil(fd, size, n, warmup, interval, nil)
}

// PingPongUntil is PingPongPaced whose warm-up, when warmUntil is set, goes
// on until warmUntil reports true (asked before each of its round trips),
// however many round trips that takes: a connection kept busy until a test
// has done something to the node, then n recorded round trips.
func PingPongUntil(fd, size, n, warmup int, interval time.Duration, warmUntil func() bool) ([]time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pp, err := NewPingPonger(fd, size)
	if err != nil {
		return nil, err
	}
	rtts := make([]time.Duration, 0, n)
	begin := time.Now()
	warming := warmUntil != nil
	for i := 0; i < n+warmup; i++ {
		if warming && i >= warmup {
			if warming = !warmUntil(); warming {
				warmup = i + 1 // this round trip is warm-up too
			}
		}
		if interval > 0 {
			if wait := time.Until(begin.Add(time.Duration(i) * interval)); wait > 0 {
				time.Sleep(wait)
			}
		}
		d, err := pp.RoundTrip()
		if err != nil {
			return rtts, fmt.Errorf("round trip %d: %w", i, err)
		}
		if i >= warmup {
			rtts = append(rtts, d)
		}
	}
	return rtts, nil
}

// PingPonger is one ping-pong connection to an echo server (Echo), driven
// one round trip at a time: the paired benchmarks change the datapath
// between two round trips, when none of the connection's bytes is in
// flight.
type PingPonger struct {
	fd        int
	msg, back []byte
}

// NewPingPonger announces size-byte messages on fd, a RawDial socket.
func NewPingPonger(fd, size int) (*PingPonger, error) {
	if size < 8 {
		return nil, fmt.Errorf("message size %d below 8 bytes", size)
	}
	var hb [4]byte
	binary.LittleEndian.PutUint32(hb[:], uint32(size))
	if err := writeFull(fd, hb[:]); err != nil {
		return nil, err
	}
	return &PingPonger{fd: fd, msg: make([]byte, size), back: make([]byte, size)}, nil
}

// RoundTrip sends one message, carrying its send time, and waits for its
// echo, which must carry the same.
func (p *PingPonger) RoundTrip() (time.Duration, error) {
	start := time.Now()
	binary.LittleEndian.PutUint64(p.msg, uint64(start.UnixNano()))
	if err := writeFull(p.fd, p.msg); err != nil {
		return 0, err
	}
	if err := readFull(p.fd, p.back); err != nil {
		return 0, err
	}
	d := time.Since(start)
	if binary.LittleEndian.Uint64(p.back) != uint64(start.UnixNano()) {
		return 0, errors.New("the echo carried another timestamp")
	}
	return d, nil
}

// PingPongPhases runs one ping-pong phase for each line read from in: a
// fresh connection to addr (RawDial), warmup and n round trips of size
// bytes, closed; and writes its result as a JSON line to out, with the
// process's CPU time from the dial to the close (RUSAGE_SELF: the phase's
// own, without the process's start, which a process per phase paid again
// each time). It returns when in ends, or at the first failed phase.
func PingPongPhases(in io.Reader, out io.Writer, addr string, size, n, warmup int) error {
	sc := bufio.NewScanner(in)
	enc := json.NewEncoder(out)
	for sc.Scan() {
		var before, after unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &before); err != nil {
			return err
		}
		fd, err := RawDial(addr)
		if err != nil {
			return err
		}
		rtts, err := PingPong(fd, size, n, warmup)
		unix.Close(fd)
		if err != nil {
			return err
		}
		if err := unix.Getrusage(unix.RUSAGE_SELF, &after); err != nil {
			return err
		}
		res := PingPongResult{Size: size, Micros: stats.Summarize(stats.Micros(rtts)), SpuriousEAGAIN: SpuriousEAGAIN.Load(),
			CPUSeconds: rusageSeconds(after) - rusageSeconds(before)}
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	return sc.Err()
}

func rusageSeconds(r unix.Rusage) float64 {
	return float64(r.Utime.Sec+r.Stime.Sec) + float64(r.Utime.Usec+r.Stime.Usec)/1e6
}
