package workload

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// The measuring UDP ends (`workload udp`, bench bypass's paired UDP round
// trips) use blocking sockets on a locked thread, as the TCP ping-pong does
// (RawDial, ServeEcho): UDPPinger here, netprobe.Echo the server. Through Go's netpoller a read that finds nothing
// parks the goroutine, and its thread spins for work, then sleeps in
// epoll_wait and is woken; whether an echo arrives within the spin changes
// the round trip's wake-ups and context switches, so a path a few hundred ns
// longer could measure microseconds longer (docs/measurements/benchmarks.md,
// "The idle agent on the paths of pods it does not select").

// ServeUDPEcho echoes every datagram back to its sender until the socket
// fails (tests that serve from a goroutine; the benches use netprobe.Echo).
func ServeUDPEcho(pc net.PacketConn) error {
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		if _, err := pc.WriteTo(buf[:n], from); err != nil {
			return err
		}
	}
}

// RawUDPDial opens a blocking UDP socket connected to addr (ip:port).
func RawUDPDial(addr string) (int, error) {
	family, sa, err := parseSockaddr(addr)
	if err != nil {
		return -1, err
	}
	if family == unix.AF_UNIX {
		return -1, fmt.Errorf("udp %s: want ip:port", addr)
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("udp %s: %w", addr, err)
	}
	return fd, nil
}

// UDPPingPong sends n datagrams of size bytes to addr, each after the echo
// of the previous one (or a timeout), and returns how many came back and the
// round-trip time of each that did.
func UDPPingPong(addr string, size, n int, timeout time.Duration) (int, []time.Duration, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fd, err := RawUDPDial(addr)
	if err != nil {
		return 0, nil, err
	}
	defer unix.Close(fd)
	u, err := NewUDPPinger(fd, size, timeout)
	if err != nil {
		return 0, nil, err
	}
	got := 0
	rtts := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		d, ok, err := u.RoundTrip()
		if err != nil {
			return got, rtts, fmt.Errorf("send %d: %w", i, err)
		}
		if ok {
			rtts = append(rtts, d)
			got++
		}
	}
	return got, rtts, nil
}

// UDPPinger sends datagrams to a UDP echo server on a connected blocking
// socket (RawUDPDial), one round trip at a time (the paired benchmarks
// change the datapath between two), from the calling thread.
type UDPPinger struct {
	fd        int
	msg, back []byte
	seq       uint64
}

// NewUDPPinger sends size-byte datagrams on fd, each waiting up to timeout
// for its echo (SO_RCVTIMEO, set once: a late echo of an earlier datagram
// starts the wait again).
func NewUDPPinger(fd, size int, timeout time.Duration) (*UDPPinger, error) {
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, fmt.Errorf("SO_RCVTIMEO: %w", err)
	}
	return &UDPPinger{fd: fd, msg: make([]byte, size), back: make([]byte, size+1)}, nil
}

// RoundTrip sends one datagram and waits for its echo: ok false when none
// came within the timeout (lost).
func (u *UDPPinger) RoundTrip() (time.Duration, bool, error) {
	// Each datagram carries its number (when it has room): an echo
	// counts only if it is this datagram's, whole.
	u.seq++
	if len(u.msg) >= 8 {
		binary.BigEndian.PutUint64(u.msg, u.seq)
	}
	t0 := time.Now()
	var err error = unix.EINTR
	for err == unix.EINTR {
		_, err = unix.Write(u.fd, u.msg)
	}
	if err != nil {
		return 0, false, err
	}
	for {
		m, err := unix.Read(u.fd, u.back)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, false, nil // timed out: lost
		case err == unix.ECONNREFUSED:
			// An ICMP port unreachable of an earlier datagram: wait on.
			continue
		case err != nil:
			return 0, false, err
		}
		if m == len(u.msg) && bytes.Equal(u.back[:m], u.msg) {
			return time.Since(t0), true, nil
		}
		// A late echo of an earlier datagram: wait on for this one.
	}
}
