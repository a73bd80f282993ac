package netlab

import (
	"os"
	"strings"
	"testing"
)

// TestLoopbackPod: the pod's namespace owns an established hash of the
// size asked (the kernel says so from inside), the host's
// tcp_child_ehash_entries is not touched, a size the kernel would round is
// refused, and Close removes the namespace.
func TestLoopbackPod(t *testing.T) {
	const sysctl = "/proc/sys/net/ipv4/tcp_child_ehash_entries"
	before, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatalf("this kernel has no %s (Linux 6.1+): %v", sysctl, err)
	}
	lab, err := New("lpod", 242)
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	if _, err := lab.AddLoopbackPod("bad", 1000); err == nil || !strings.Contains(err.Error(), "power of two") {
		t.Fatalf("1000 buckets: %v, want refused", err)
	}
	p, err := lab.AddLoopbackPod("g", 1024)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.ehashEntries(); err != nil || n != 1024 {
		t.Fatalf("the pod's tcp_ehash_entries: %d, %v; want 1024", n, err)
	}
	if after, err := os.ReadFile(sysctl); err != nil || string(after) != string(before) {
		t.Fatalf("the host's tcp_child_ehash_entries went from %q to %q (%v)", before, after, err)
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/run/netns/" + p.NetNS); !os.IsNotExist(err) {
		t.Fatalf("namespace %s left after Close: %v", p.NetNS, err)
	}
}
