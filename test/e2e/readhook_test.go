package e2e

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"golang.org/x/sys/unix"
)

// linkRuns counts the runs of the program of the link pinned at pin, from
// now until the test ends (BPF_ENABLE_STATS, which ends with its file
// descriptor, at the test's cleanup).
func linkRuns(t *testing.T, pin string) func() uint64 {
	t.Helper()
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		t.Fatalf("link %s: %v", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prog.Close() })
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("BPF_ENABLE_STATS: %v", err)
	}
	t.Cleanup(func() { stats.Close() })
	return func() uint64 {
		st, err := prog.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.RunCount
	}
}

// TestReadHookScope: where the kernel allows fexit, the read counter runs
// for the reads of accelerated sockets only: a plain-TCP transfer between
// pods outside the managed cgroups runs it not once, an accelerated one
// does. Where fexit is refused the tracepoint runs for every recvmsg on the
// node, the plain transfer's included: what docs/measurements/benchmarks.md ("Reads
// counted by fexit") measures. Run counts come from BPF_ENABLE_STATS,
// which ends with its file descriptor.
func TestReadHookScope(t *testing.T) {
	e := newEnv(t, "rhs", 34)
	a, b := e.pod("a", true), e.pod("b", true)
	u, v := e.pod("u", false), e.pod("v", false)
	e.serve(b, "--stream", ":7000")
	e.serve(v, "--stream", ":7000")
	e.accelerate()
	read, _ := e.dp.Parts().Get(parts.ReadAccounting)
	name := "ez_sc_recv_fx"
	if !strings.HasPrefix(read.Via, "fexit/") {
		checkReadHook(t, read) // the tracepoint, where fexit is refused
		name = "ez_sc_recv"
	}
	runs := linkRuns(t, bpfsys.LinkPin(e.cfg.Dir(), bpfsys.KindTracing, name))
	transfer := func(from *netlab.Pod, to string) uint64 {
		before := runs()
		if out, err := e.run(from, streamCase{conns: 1, parallel: 1, up: 1 << 20, down: 1 << 20, chunk: 4096, handshake: true}.args(to, 5)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return runs() - before
	}
	plain := transfer(u, hostport(v.IPv4, 7000))
	c0 := e.counters()
	accel := transfer(a, hostport(b.IPv4, 7000))
	if d := delta(c0, e.counters()); d["pairs"] != 1 || d["bytes_redirected"] == 0 {
		t.Fatalf("the managed pods' transfer was not accelerated: %v", d)
	}
	t.Logf("%s ran %d times during the plain transfer, %d during the accelerated one", name, plain, accel)
	if accel == 0 {
		t.Errorf("%s never ran while an accelerated socket read", name)
	}
	if name == "ez_sc_recv_fx" && plain != 0 {
		t.Errorf("%s ran %d times for sockets without a psock", name, plain)
	}
	if name == "ez_sc_recv" && plain == 0 {
		t.Errorf("the tracepoint did not run for plain TCP reads: nothing measured")
	}
}
