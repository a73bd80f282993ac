package e2e

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// TestFionreadFirstMessage measures exactly what the reader gate
// (bpf/shortcut/splice.h) changes in FIONREAD: a connection's first bytes
// to a socket that has not read yet take the kernel path, and on kernels
// whose tcp_bpf answers FIONREAD from the psock alone (tcp_bpf_ioctl, Linux
// 6.15 and Debian's 6.12.75) an enrolled socket then reports 0 for bytes
// waiting in its TCP receive queue. The bytes themselves are exact; where
// the kernel has no tcp_bpf_ioctl, FIONREAD is exact too.
func TestFionreadFirstMessage(t *testing.T) {
	e := newEnv(t, "fion1", 86)
	a, b := e.pod("a", true), e.pod("b", true)
	const n = 1000
	payload := strings.Repeat("0123456789", n/10)
	e.sink(b, netip.AddrPortFrom(b.IPv4, 7600), payload)
	measure := func() fionreadFirstOut {
		t.Helper()
		out, err := e.run(a, "workload", "fionread-first", "--addr", hostport(b.IPv4, 7600), "--bytes", "1000")
		if err != nil {
			t.Fatal(err)
		}
		var r fionreadFirstOut
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %q", err, out)
		}
		if r.Read != payload {
			t.Fatalf("read %d bytes, not the server's %d", len(r.Read), n)
		}
		return r
	}
	plain := measure()
	if plain.FIONREAD != n {
		t.Fatalf("plain TCP: FIONREAD %d before the first read, want %d", plain.FIONREAD, n)
	}

	e.accelerate()
	before := e.counters()
	got := measure()
	d := delta(before, e.counters())
	if d["pairs"] != 1 || d["rx_gated"] == 0 {
		t.Fatalf("want one pair whose first message took the kernel path (rx_gated), so the case is the one documented: %v", d)
	}
	want := n
	if _, err := kernelFunc("tcp_bpf_ioctl"); err == nil {
		want = 0
	}
	if got.FIONREAD != want {
		t.Errorf("accelerated: FIONREAD %d before the first read, want exactly %d on this kernel (plain TCP: %d)", got.FIONREAD, want, n)
	}
	if want != n {
		t.Logf("KNOWN DIFFERENCE (docs/host.md, Known differences): FIONREAD %d for the first %d bytes before any read (plain TCP %d): tcp_bpf_ioctl counts psock bytes only, and the reader gate sent them through the kernel", got.FIONREAD, n, plain.FIONREAD)
	}
}

// fionreadFirstOut is workload fionread-first's line.
type fionreadFirstOut struct {
	FIONREAD int    `json:"fionread"`
	Read     string `json:"read"`
}

// kernelFunc finds a function in the running kernel's BTF.
func kernelFunc(name string) (*btf.Func, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, err
	}
	var fn *btf.Func
	return fn, spec.TypeByName(name, &fn)
}
