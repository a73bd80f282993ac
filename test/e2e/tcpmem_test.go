package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/lab/netlab"
)

// TestTCPMemoryPressure: bytes redirected into a receiver are charged to
// it (bpf_tcp_ingress -> __sk_rmem_schedule), and under node TCP memory
// pressure that charge fails: the sender's write returned ENOMEM, which
// plain TCP never returns (its sender waits for memory). Here the node's
// tcp_mem is lowered to a few MiB above what TCP holds now (restored after,
// and recorded for the lab's sweep), and a receiver pauses while its peer
// streams 256 MiB into it: on plain TCP and accelerated, every byte must
// arrive, and accelerated the direction must have gone back to the kernel
// path under the pressure (rx_regated) rather than fail the write.
func TestTCPMemoryPressure(t *testing.T) {
	e := newEnv(t, "tcpmem", 39)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000")
	e.cfg.MaxUnread = 1 << 30 // only the node's TCP memory bounds the unread bytes
	lowTCPMem(t, e, 1024, 2048, 4096)
	// The client writes 1 MiB, pauses 3 s without reading, writes 1 MiB
	// more and then reads: during the pause the server's 256 MiB pile up.
	c := streamCase{conns: 1, parallel: 1, up: 2 << 20, down: 256 << 20, chunk: 256 << 10, handshake: true}
	for _, accel := range []bool{false, true} {
		t.Run(fmt.Sprintf("accel=%v", accel), func(t *testing.T) {
			if accel {
				e.accelerate()
			}
			var before map[string]uint64
			if accel {
				before = e.counters()
			}
			e.runStreamCase(t, a, c, hostport(b.IPv4, 7000), 5, "--pause", "3s")
			if !accel {
				return
			}
			d := delta(before, e.counters())
			t.Logf("counters: %v", d)
			if d["pairs"] != 1 || d["bytes_redirected"] == 0 {
				t.Errorf("the connection was not accelerated, nothing was tested: %v", d)
			}
			if d["rx_regated"] == 0 {
				t.Errorf("no direction went back to the kernel path under TCP memory pressure (rx_regated 0): %v", d)
			}
		})
	}
}

// lowTCPMem sets net.ipv4.tcp_mem (pages; host-wide) to what TCP holds now
// plus low, pressure and high, for the test's duration.
func lowTCPMem(t *testing.T, e *env, low, pressure, high int) {
	t.Helper()
	const path = "/proc/sys/net/ipv4/tcp_mem"
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	undo, err := e.lab.Record(netlab.RecSysctl, path, strings.Join(strings.Fields(string(old)), " "))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := undo(); err != nil {
			t.Errorf("restore %s: %v", path, err)
		}
	})
	inUse := tcpPagesInUse(t)
	v := fmt.Sprintf("%d %d %d", inUse+low, inUse+pressure, inUse+high)
	if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("tcp_mem %s (was %s), TCP holds %d pages", v, strings.Join(strings.Fields(string(old)), " "), inUse)
}

// tcpPagesInUse is the node's TCP memory in pages (/proc/net/sockstat, "mem").
func tcpPagesInUse(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "TCP:" {
			for i := 1; i+1 < len(f); i++ {
				if f[i] == "mem" {
					n, err := strconv.Atoi(f[i+1])
					if err != nil {
						t.Fatal(err)
					}
					return n
				}
			}
		}
	}
	t.Fatalf("no TCP mem in /proc/net/sockstat:\n%s", b)
	return 0
}
