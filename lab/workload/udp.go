package workload

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"time"
)

// ServeUDPEcho echoes every datagram back to its sender until the socket fails.
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

// UDPPingPong sends n datagrams of size bytes to addr, each after the echo
// of the previous one (or a timeout), and returns how many came back and the
// round-trip time of each that did.
func UDPPingPong(addr string, size, n int, timeout time.Duration) (int, []time.Duration, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	u := NewUDPPinger(c, size, timeout)
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

// UDPPinger sends datagrams to a UDP echo server on a connected socket,
// one round trip at a time (the paired benchmarks change the datapath
// between two).
type UDPPinger struct {
	c         net.Conn
	msg, back []byte
	seq       uint64
	timeout   time.Duration
}

// NewUDPPinger sends size-byte datagrams on c, each waiting up to timeout
// for its echo.
func NewUDPPinger(c net.Conn, size int, timeout time.Duration) *UDPPinger {
	return &UDPPinger{c: c, msg: make([]byte, size), back: make([]byte, size+1), timeout: timeout}
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
	if _, err := u.c.Write(u.msg); err != nil {
		return 0, false, err
	}
	u.c.SetReadDeadline(t0.Add(u.timeout))
	for {
		m, err := u.c.Read(u.back)
		if err != nil {
			return 0, false, nil // timed out: lost
		}
		if m == len(u.msg) && bytes.Equal(u.back[:m], u.msg) {
			return time.Since(t0), true, nil
		}
		// A late echo of an earlier datagram: wait on for this one.
	}
}
