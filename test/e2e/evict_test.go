package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/lab/logbuf"
)

const evictServer = `
import socket, sys, json, os, time
N = int(sys.argv[2])
l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", int(sys.argv[1])))
l.listen(4096)
print("LISTEN", flush=True)
c, _ = l.accept()
def rx(n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d:
            break
        b += d
    return b
c.sendall(b"H")
while not os.path.exists(sys.argv[3]):
    time.sleep(0.01)
c.sendall(b"S" * N)
ok = rx(N) == b"C" * N
c.sendall(b"T" * N)
print(json.dumps({"server_got": ok}), flush=True)
rx(1)
`

const evictClient = `
import socket, sys, json
N = int(sys.argv[3])
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def rx(n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b))
        if not d:
            break
        b += d
    return b
h = rx(1)
print("GOT0", flush=True)
a = h == b"H" and rx(N)
print("GOT1", flush=True)
sys.stdin.readline()
s.sendall(b"C" * N)
b = rx(N)
print(json.dumps({"first": a == b"S" * N, "second": b == b"T" * N}), flush=True)
sys.stdin.readline()
`

// TestPairEvictedBeforeClientSettles: a server-speaks-first connection is
// paired (the server's bytes are redirected into the client) while the
// client has not sent yet, so its pairing record waits for the client to
// learn the outcome. A SYN scan then evicts the record from the LRU map.
// The client's first send finds no record: the connection must switch to
// the kernel path whole (no byte lost, none out of order, both ends leave
// the sockhash and the unread record is released), counted as
// fallback_evicted.
func TestPairEvictedBeforeClientSettles(t *testing.T) {
	e := newEnv(t, "tpe", 84)
	a, b := e.pod("a", true), e.pod("b", true)
	scanner := e.pod("scan", false)
	pin := e.cfg.PinRoot
	t.Cleanup(func() { eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
	startAgent(t, bin, e.lab.Managed, pin, "--max-pairs", "100")
	const n = 65536
	// The server's greeting takes the kernel path (the client has not read
	// yet: the reader gate, splice.h); once the client read it, the
	// server's next bytes are redirected.
	resume := filepath.Join(t.TempDir(), "resume")
	_, srvOut := e.startLogged(b, python, "-c", evictServer, "7950", strconv.Itoa(n), resume)
	waitUntil(t, "the server's listener", 10*time.Second, func() bool { return strings.Contains(srvOut.String(), "LISTEN") })
	before := pinnedCounters(t, pin)

	ctx, cancel := context.WithCancel(context.Background())
	cmd := a.Cmd(ctx, python, "-c", evictClient, b.IPv4.String(), "7950", strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cliOut := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = cliOut, cliOut
	if err := a.Start(cmd); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cancel(); cmd.Wait() })
	waitUntil(t, "the client's greeting", 10*time.Second, func() bool { return strings.Contains(cliOut.String(), "GOT0") })
	if err := os.WriteFile(resume, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the client's first read", 10*time.Second, func() bool { return strings.Contains(cliOut.String(), "GOT1") })
	if d := delta(before, pinnedCounters(t, pin)); d["pairs"] != 1 || d["bytes_redirected"] < n {
		t.Fatalf("the connection did not pair before the scan: %v", d)
	}

	synScanEveryCPU(t, scanner, netip.AddrPortFrom(b.IPv4, 7950), 1000)
	io.WriteString(stdin, "go\n")
	waitUntil(t, "the client's result", 20*time.Second, func() bool { return strings.Contains(cliOut.String(), "second") })
	var res struct{ First, Second bool }
	line := cliOut.String()[strings.Index(cliOut.String(), "{"):]
	if err := json.Unmarshal([]byte(strings.TrimSpace(strings.SplitN(line, "\n", 2)[0])), &res); err != nil || !res.First || !res.Second {
		t.Fatalf("client: %v\n%s", err, cliOut)
	}
	waitUntil(t, "the server's result", 10*time.Second, func() bool { return strings.Contains(srvOut.String(), "server_got") })
	if !strings.Contains(srvOut.String(), `"server_got": true`) {
		t.Fatalf("server: %s", srvOut)
	}
	d := delta(before, pinnedCounters(t, pin))
	if d["fallback_evicted"] != 1 {
		t.Errorf("fallback_evicted %d, want 1: %v", d["fallback_evicted"], d)
	}
	// Both ends leave the sockhash while still open.
	waitUntil(t, "both ends out of the sockhash", 10*time.Second, func() bool { return pinnedEntries(t, pin, "ez_sc_sockets") == 0 })
	io.WriteString(stdin, "done\n")
	stdin.Close()
	waitUntil(t, "the unread record released", 10*time.Second, func() bool { return pinnedEntries(t, pin, "ez_sc_unreads") == 0 })
}
