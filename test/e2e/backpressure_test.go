package e2e

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// tcpMem is the node's TCP memory in bytes (bench.TCPMemPages: global,
// not per namespace).
func tcpMem(t *testing.T) int {
	t.Helper()
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatal(err)
	}
	pages, err := bench.TCPMemPages(fs)
	if err != nil {
		t.Fatalf("TCP mem in /proc/net/sockstat: %v", err)
	}
	return pages * os.Getpagesize()
}

// stuckRun is one stuck-server/stuck-client run between two pods.
type stuckRun struct {
	conns, bytes   int
	rcvbuf, sndbuf int // 0: autotuning
	rate           int // server reads at this rate from the start; 0: stuck until released
	chunk          int // bytes per write; 0: 1 MiB
	port           int
}

// stuckResult: the peak of node TCP memory above the baseline while the
// client ran, and whether the client was still blocked when the readers
// were released.
type stuckResult struct {
	peak    int
	blocked bool
}

// run starts the server in b and the client in a. A stuck server's readers
// are released once node TCP memory stopped growing (the senders are
// blocked); then every connection must deliver its stream byte-exact.
func (r stuckRun) run(t *testing.T, e *env, a, b *netlab.Pod) stuckResult {
	t.Helper()
	dir := t.TempDir()
	goFile, ready := filepath.Join(dir, "go"), filepath.Join(dir, "ready")
	args := []string{"workload", "stuck-server", "--addr", ":" + strconv.Itoa(r.port), "--ready-file", ready,
		"--rcvbuf", strconv.Itoa(r.rcvbuf), "--rate", strconv.Itoa(r.rate)}
	if r.rate == 0 {
		args = append(args, "--go-file", goFile)
	}
	sctx, scancel := context.WithCancel(context.Background())
	srv := b.Cmd(sctx, labBin, args...)
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := b.Start(srv); err != nil {
		scancel()
		t.Fatal(err)
	}
	defer func() { scancel(); srv.Wait() }()
	waitFile(t, ready, func() string { return srvErr.String() })

	base := tcpMem(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := a.Cmd(ctx, labBin, "workload", "stuck-client", "--addr", hostport(b.IPv4, r.port),
		"--conns", strconv.Itoa(r.conns), "--bytes", strconv.Itoa(r.bytes), "--chunk", strconv.Itoa(cmp.Or(r.chunk, 1<<20)),
		"--sndbuf", strconv.Itoa(r.sndbuf))
	var out bytes.Buffer
	cli.Stdout, cli.Stderr = &out, &out
	if err := a.Start(cli); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cli.Wait() }()

	res := stuckResult{}
	sample := func() {
		if m := tcpMem(t) - base; m > res.peak {
			res.peak = m
		}
	}
	if r.rate == 0 {
		// Wait until memory stops growing for a second: the senders are blocked.
		last, still := -1, 0
		for still < 10 {
			select {
			case err := <-done:
				t.Fatalf("client finished while the server read nothing (%v): %s", err, out.String())
			case <-time.After(100 * time.Millisecond):
			}
			sample()
			if m := tcpMem(t) - base; m-last < 64<<10 {
				still++
			} else {
				last, still = m, 0
			}
		}
		res.blocked = true
		if err := os.WriteFile(goFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("client: %v: %s (server: %s)", err, out.String(), srvErr.String())
			}
			return res
		case <-time.After(100 * time.Millisecond):
			sample()
		}
	}
}

// unreadEntries counts the pinned per-connection unread records.
// compare runs r over plain TCP, then with the datapath installed (on the
// next port), and returns both results, the counters' change over the
// accelerated run and the unread records before it (for waitUnread).
func (r stuckRun) compare(t *testing.T, e *env, a, b *netlab.Pod, what string) (plain, accel stuckResult, d datapath.Counters, unread0 int) {
	t.Helper()
	plain = r.run(t, e, a, b)
	t.Logf("plain TCP, %s: node TCP memory peaked %.1f MiB above baseline; writer blocked: %v", what, float64(plain.peak)/mib, plain.blocked)
	e.accelerate()
	unread0 = unreadEntries(t, e)
	before := e.counters()
	r.port++
	accel = r.run(t, e, a, b)
	d = delta(before, e.counters())
	t.Logf("accelerated, %s: node TCP memory peaked %.1f MiB above baseline; counters %v", what, float64(accel.peak)/mib, d)
	return plain, accel, d, unread0
}

func unreadEntries(t *testing.T, e *env) int {
	t.Helper()
	p, err := datapath.OpenPinned(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	n, err := shortcut.Entries(p.Unreads)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitUnread waits for the unread records to return to n (both ends of
// every connection closed).
func waitUnread(t *testing.T, e *env, n int) {
	t.Helper()
	deadline := time.Now().Add(scaled(10 * time.Second))
	for {
		got := unreadEntries(t, e)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("unread records did not return to %d: %d", n, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

const mib = 1 << 20

// readModes are the two ways the unread bound learns what a receiver holds:
// reads counted (fexit/tcp_bpf_recvmsg, or tp_btf/sock_recv_length where
// fexit is refused, as on hosts that refuse tracing programs), and, on
// kernels with neither, the gauge of the receiver's sk_rmem_alloc
// (bpf/shortcut/unread.h), forced here by refusing both counters.
var readModes = []struct {
	name   string
	refuse string // bpfsys.TestRefuseEnv
}{{"counted", ""}, {"gauge", refuseReads}}

// refuseReads names both read counters in bpfsys.TestRefuseEnv: the agent
// gauges receivers instead.
const refuseReads = "ez_sc_recv_fx,ez_sc_recv"

// checkReadHook fails t unless reads are counted by the best hook this
// kernel allows: the fexit where a trial fexit on tcp_bpf_recvmsg loads,
// else the tracepoint.
func checkReadHook(t *testing.T, st parts.Status) {
	t.Helper()
	want := "tp_btf/sock_recv_length"
	if bpfsys.Fexit("tcp_bpf_recvmsg")() == nil {
		want = "fexit/tcp_bpf_recvmsg"
	}
	if !st.Runs || !strings.HasPrefix(st.Via, want) {
		t.Errorf("read accounting %+v, want it counted by %s", st, want)
	}
	t.Logf("reads counted by %s", st.Via)
}

// TestBackpressureStuckReader: the server accepts and never reads, the
// client writes 1 MiB chunks. Plain TCP blocks the writer after a few MB;
// accelerated, node TCP memory must stay as bounded (it grew to tcp_mem's
// limits and ended in ENOMEM before), the writer must block, and once the
// reader resumes every byte arrives in order. On a stock kernel the
// connection switched for backpressure, and both ends left the sockhash
// once drained (with reads counted; with the gauge the reader's end stays
// until it closes); on a kernel with ingress backpressure it kept the
// shortcut.
func TestBackpressureStuckReader(t *testing.T) {
	for i, m := range readModes {
		t.Run(m.name, func(t *testing.T) {
			t.Setenv(bpfsys.TestRefuseEnv, m.refuse)
			e := newEnv(t, "bpstk"+strconv.Itoa(i), 61+3*i)
			a, b := e.pod("a", true), e.pod("b", true)
			plain, accel, d, u0 := stuckRun{conns: 1, bytes: 64 * mib, port: 7200}.compare(t, e, a, b, "a stuck reader")
			if accel.peak > 16*mib {
				t.Errorf("node TCP memory grew %.1f MiB with a stuck reader, bound 16 MiB (plain TCP: %.1f MiB)", float64(accel.peak)/mib, float64(plain.peak)/mib)
			}
			if d["pairs"] != 1 || d["bytes_redirected"] == 0 {
				t.Errorf("the connection was not accelerated, nothing was tested: %v", d)
			}
			if kernelBP(t, e) {
				// The kernel held the writer: the connection kept the
				// shortcut, and every byte went through it. It leaves the
				// shortcut only at the writer's shutdown, once all is read
				// (the half-close switch: fallback_half_close, both ends
				// released with reads counted).
				if d["fallback_backpressure"] != 0 || d["sockets_released"] > 2*d["fallback_half_close"] {
					t.Errorf("the kernel holds the writer, yet the connection switched: %v", d)
				}
				if d["bytes_redirected"] < 64*mib {
					t.Errorf("%d bytes redirected, want all 64 MiB on the shortcut", d["bytes_redirected"])
				}
				waitUnread(t, e, u0)
				return
			}
			if d["fallback_backpressure"] != 1 {
				t.Errorf("fallback_backpressure %d, want 1", d["fallback_backpressure"])
			}
			// Reads are gauged where both counters are refused, and on a
			// kernel with neither (6.1 refusing fexit) in both subtests.
			want := uint64(2)
			if st, _ := e.dp.Parts().Get(parts.ReadAccounting); strings.HasPrefix(st.Via, "gauge") {
				// Gauged, an end that received anything stays, and both
				// did: the stuck workload's hello goes both ways (so the
				// server has read before the stream, bpf/shortcut/splice.h).
				want = 0
			} else if m.refuse != "" {
				t.Errorf("both read counters refused but reads are counted: %+v", st)
			} else {
				checkReadHook(t, st)
			}
			if d["sockets_released"] != want {
				t.Errorf("sockets_released %d, want %d", d["sockets_released"], want)
			}
			if d["bytes_redirected"] > 16*mib {
				t.Errorf("%d bytes redirected to a stuck reader", d["bytes_redirected"])
			}
			waitUnread(t, e, u0)
		})
	}
}

// TestBackpressureSlowReader: a reader at 1 MiB/s against a writer as fast
// as it can, for about 20 s: byte-exact, memory bounded like plain TCP's.
func TestBackpressureSlowReader(t *testing.T) {
	e := newEnv(t, "bpslow", 62)
	a, b := e.pod("a", true), e.pod("b", true)
	plain, accel, d, u0 := stuckRun{conns: 1, bytes: 20 * mib, rate: mib, port: 7200}.compare(t, e, a, b, "a slow reader")
	if accel.peak > 16*mib {
		t.Errorf("node TCP memory grew %.1f MiB with a slow reader, bound 16 MiB (plain TCP: %.1f MiB)", float64(accel.peak)/mib, float64(plain.peak)/mib)
	}
	if d["pairs"] != 1 || d["bytes_redirected"] == 0 {
		t.Errorf("the connection was not accelerated, nothing was tested: %v", d)
	}
	waitUnread(t, e, u0)
}

// TestBackpressureManyStuckReaders: 100 connections to readers that stop,
// with SO_RCVBUF and SO_SNDBUF set by the applications (so the bound is the
// receiver's sk_rcvbuf): node TCP memory stays proportional to what each
// connection may hold, and every stream arrives byte-exact on resume.
func TestBackpressureManyStuckReaders(t *testing.T) {
	e := newEnv(t, "bpmany", 63)
	a, b := e.pod("a", true), e.pod("b", true)
	const conns, buf = 100, 256 << 10
	// 64 KiB writes: a message smaller than the bound is redirected first.
	run := stuckRun{conns: conns, bytes: 8 * mib, rcvbuf: buf, sndbuf: buf, chunk: 64 << 10, port: 7200}
	plain, accel, d, u0 := run.compare(t, e, a, b, fmt.Sprintf("%d stuck readers", conns))
	// Per connection: the bound (sk_rcvbuf, twice SO_RCVBUF), the sender's
	// sk_sndbuf (twice SO_SNDBUF) after the switch, and slack for what TCP
	// has in flight.
	if limit := conns * (2*buf + 2*buf + 2*buf); accel.peak > limit {
		t.Errorf("node TCP memory grew %.1f MiB with %d stuck readers, bound %.1f MiB (plain TCP: %.1f MiB)",
			float64(accel.peak)/mib, conns, float64(limit)/mib, float64(plain.peak)/mib)
	}
	if d["pairs"] != conns || d["bytes_redirected"] == 0 {
		t.Errorf("pairs %d, want %d, and redirected bytes: %v", d["pairs"], conns, d)
	}
	want := uint64(conns) // each connection switched at its receiver's bound
	if kernelBP(t, e) {
		want = 0 // the kernel held each writer at its receiver's sk_rcvbuf
	}
	if d["fallback_backpressure"] != want {
		t.Errorf("fallback_backpressure %d, want %d", d["fallback_backpressure"], want)
	}
	waitUnread(t, e, u0)
}

// kernelBP reports whether the agent found the kernel's ingress
// backpressure (kernel/patches): then a slow reader holds its writer and no
// connection switches. Logged, so a run says which behaviour it proved.
func kernelBP(t *testing.T, e *env) bool {
	t.Helper()
	st, _ := e.dp.Parts().Get(parts.KernelBP)
	t.Logf("kernel backpressure: %v %s%s", st.Runs, st.Via, st.Reason)
	return st.Runs
}
