package e2e

import (
	"fmt"
	"testing"
)

// TestEarlyDataPairs: a client that writes before its server end is
// established (client-first protocols, HTTP among them, write right after
// connect; under load the server's ESTABLISHED often comes later) is still
// paired, and its direction opens once the server has read those bytes.
//
// The race is made certain: the server pod drops the handshake's final ACK
// (the second packet of the connection), so the server end is established
// only by the client's first data segment, after the client's sk_msg ran.
// Byte-exact streams check the order across the switch: first with the
// streams pipelined from the first byte, then with a request/response first
// (workload --handshake), where every stream byte must take the shortcut.
func TestEarlyDataPairs(t *testing.T) {
	e := newEnv(t, "early", 38)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000")
	// IPv4 with timestamps: a bare ACK is 52 bytes; the client's first
	// data segment (the 32-byte stream header) is longer.
	nsExec(t, b.NetNS, "iptables", "-w", "-A", "INPUT", "-p", "tcp", "--dport", "7000",
		"--tcp-flags", "ALL", "ACK", "-m", "length", "--length", "40:60",
		"-m", "connbytes", "--connbytes", "2:2", "--connbytes-dir", "original", "--connbytes-mode", "packets",
		"-j", "DROP")
	e.accelerate()
	for i, c := range []streamCase{
		// The client reads the downstream only after writing its upstream:
		// 2 MiB and 64 KiB stay below the default unread bound (the
		// smaller of tcp_rmem's max, 6 MiB by default, and 4 MiB), so no
		// backpressure switch.
		{conns: 4, parallel: 4, up: 2 << 20, down: 64 << 10, chunk: 64 << 10},
		{conns: 4, parallel: 4, up: 2 << 20, down: 64 << 10, chunk: 64 << 10, handshake: true},
	} {
		t.Run(fmt.Sprintf("handshake=%v", c.handshake), func(t *testing.T) {
			before := e.counters()
			e.runStreamCase(t, a, c, hostport(b.IPv4, 7000), 100+i)
			d := delta(before, e.counters())
			t.Logf("counters: %v", d)
			if d["pairs"] != uint64(c.conns) || d["fallback_early_data"] != 0 {
				t.Errorf("%d connections whose client wrote first: %d paired, %d early-data fallbacks; want all paired", c.conns, d["pairs"], d["fallback_early_data"])
			}
			if d["rx_gated"] == 0 {
				t.Errorf("the early bytes were not held on the kernel path (rx_gated 0): the drop rule did not delay the server end, nothing was tested: %v", d)
			}
			if want := uint64(c.conns) * (c.up + c.down); c.handshake && d["bytes_redirected"] < want {
				t.Errorf("after a request/response %d bytes were redirected, want every stream byte (%d)", d["bytes_redirected"], want)
			}
		})
	}
	// The rule really dropped the handshake's ACKs: one per connection.
	if n := dropped(t, b.NetNS, "INPUT"); n != 8 {
		t.Errorf("the drop rule dropped %d packets, want the 8 handshake ACKs", n)
	}
}
