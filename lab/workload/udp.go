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
	msg := make([]byte, size)
	back := make([]byte, size+1)
	got := 0
	rtts := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		// Each datagram carries its number (when it has room): an echo
		// counts only if it is this datagram's, whole.
		if size >= 8 {
			binary.BigEndian.PutUint64(msg, uint64(i)+1)
		}
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return got, rtts, fmt.Errorf("send %d: %w", i, err)
		}
		c.SetReadDeadline(t0.Add(timeout))
		for {
			m, err := c.Read(back)
			if err != nil {
				break // timed out: lost
			}
			if m == size && bytes.Equal(back[:m], msg) {
				rtts = append(rtts, time.Since(t0))
				got++
				break
			}
			// A late echo of an earlier datagram: wait on for this one.
		}
	}
	return got, rtts, nil
}
