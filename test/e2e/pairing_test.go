package e2e

import (
	"testing"

	"github.com/eztunnel/eztunnel/lab/netlab"
)

// streamCounted runs a stream batch from client to addr with the
// datapath on and returns the counter deltas.
func (e *env) streamCounted(p *netlab.Pod, c streamCase, addr string, seed int) map[string]uint64 {
	e.t.Helper()
	before := e.counters()
	if out, err := e.run(p, c.args(addr, seed)...); err != nil {
		e.t.Fatalf("%v\n%s", err, out)
	}
	return delta(before, e.counters())
}

// TestAddressFamilies: IPv4, IPv6, and an AF_INET client reaching a
// dual-stack AF_INET6 listener (its accepted socket is v4-mapped) pair exactly.
func TestAddressFamilies(t *testing.T) {
	e := newEnv(t, "fam", 16)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", "0.0.0.0:7004", "--stream", "[::]:7006")
	e.accelerate()
	c := streamCase{conns: 50, parallel: 50, up: 256 << 10, down: 256 << 10, chunk: 8192}
	for _, tc := range []struct{ name, addr string }{
		{"ipv4", hostport(b.IPv4, 7004)},
		{"ipv6", hostport(b.IPv6, 7006)},
		{"ipv4-client-dual-stack-listener", hostport(b.IPv4, 7006)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := e.streamCounted(a, c, tc.addr, 1)
			if d["pairs"]+d["fallback_early_data"] != uint64(c.conns) || d["pairs"] == 0 {
				t.Errorf("want %d connections paired, counters %v", c.conns, d)
			}
		})
	}
}

// TestOffNodePeerNotEnrolled: a managed client whose server is outside the
// managed cgroups is never enrolled: no sk_msg runs on its messages.
func TestOffNodePeerNotEnrolled(t *testing.T) {
	e := newEnv(t, "off", 17)
	a, out := e.pod("a", true), e.pod("out", false)
	e.serve(out, "--stream", ":7000")
	e.accelerate()
	c := streamCase{conns: 20, parallel: 20, up: 64 << 10, down: 64 << 10, chunk: 4096}
	d := e.streamCounted(a, c, hostport(out.IPv4, 7000), 1)
	if d["sockets_enrolled"] != 0 || d["messages_redirected"] != 0 {
		t.Errorf("connections to an unmanaged peer were enrolled: %v", d)
	}
	if d["fallback_no_local_peer"] != uint64(c.conns) {
		t.Errorf("fallback_no_local_peer = %d, want %d", d["fallback_no_local_peer"], c.conns)
	}
	// And the other way round: unmanaged client, managed server.
	e.serve(a, "--stream", ":7001")
	d = e.streamCounted(out, c, hostport(a.IPv4, 7001), 2)
	if d["sockets_enrolled"] != 0 || d["messages_redirected"] != 0 {
		t.Errorf("connections from an unmanaged peer were enrolled: %v", d)
	}
}
