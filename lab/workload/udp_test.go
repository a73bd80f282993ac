package workload

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/netprobe"
)

// TestUDPPingPongRaw runs the blocking UDP client against netprobe.Echo over loopback,
// IPv4 and IPv6: every datagram comes back, and a port without a server
// loses every datagram (its ICMP errors are not echoes).
func TestUDPPingPongRaw(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "::1"} {
		t.Run(host, func(t *testing.T) {
			fd, bound, err := netprobe.ListenUDP(netip.AddrPortFrom(netip.MustParseAddr(host), 0))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { netprobe.Echo(fd, -1); close(done) }()
			// A shutdown wakes the server's blocking recvfrom; it then returns.
			t.Cleanup(func() { unix.Shutdown(fd, unix.SHUT_RDWR); <-done; unix.Close(fd) })
			port := int(bound.Port())
			addr := netip.AddrPortFrom(netip.MustParseAddr(host), uint16(port)).String()
			got, rtts, err := UDPPingPong(addr, 100, 200, 5*time.Second)
			if err != nil || got != 200 || len(rtts) != 200 {
				t.Fatalf("UDPPingPong(%s): %d echoed, %d round trips, %v; want 200", addr, got, len(rtts), err)
			}
			// The port after the server's: nothing listens there (a
			// datagram there draws an ICMP port unreachable).
			closed := netip.AddrPortFrom(netip.MustParseAddr(host), uint16(port+1)).String()
			if got, _, err := UDPPingPong(closed, 100, 3, 50*time.Millisecond); err != nil || got != 0 {
				t.Errorf("UDPPingPong(%s), no server: %d echoed, %v; want 0 and no error", closed, got, err)
			}
		})
	}
}

// TestRawUDPBadAddress names the address it could not use.
func TestRawUDPBadAddress(t *testing.T) {
	for _, a := range []string{"unix:/tmp/x", "no-port", "127.0.0.1:" + strconv.Itoa(1<<17)} {
		if fd, err := RawUDPDial(a); err == nil {
			unix.Close(fd)
			t.Errorf("RawUDPDial(%q): no error", a)
		}
	}
}
