package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

const probePort = 7100

// semCase is one socket-semantics scenario against one server.
type semCase struct {
	name, scenario string
	unmanagedPeer  bool // the server lives in an unmanaged pod: never accelerated
	loopback       bool // the server is in the client's pod, over its loopback (an application and its sidecar)
	v6             bool
	conns          uint64 // connections the scenario opens (pairs expected)
	backpressure   uint64 // connections expected to switch to the kernel path (fallback_backpressure)
	resets         uint64 // FINs expected to go out as RST (close with redirected bytes unread)
	// splices: the server reads its scenario line with recv, then splices
	// (bpf/shortcut/splice.h): its connection switches at the splice (or
	// at the client's half close, if that came first), and
	// bytes redirected before it are stranded (splice_stranded) or not,
	// as the client's first write and the splice race.
	splices bool
}

var semCases = []semCase{
	{name: "fionread", scenario: "fionread", conns: 1},
	{name: "fionread_v6", scenario: "fionread", v6: true, conns: 1},
	{name: "fionread_unmanaged_peer", scenario: "fionread", unmanagedPeer: true},
	{name: "poll", scenario: "poll", conns: 1},
	{name: "epoll_lt", scenario: "epoll_lt", conns: 1},
	{name: "epoll_et", scenario: "epoll_et", conns: 1},
	{name: "peek", scenario: "peek", conns: 1},
	{name: "waitall", scenario: "waitall", conns: 1},
	{name: "half_close", scenario: "half_close", conns: 1},
	{name: "close_unread", scenario: "close_unread", conns: 1, resets: 1},
	{name: "close_unread_v6", scenario: "close_unread", v6: true, conns: 1, resets: 1},
	{name: "close_unread_loopback", scenario: "close_unread", loopback: true, conns: 1, resets: 1},
	{name: "sendfile", scenario: "sendfile", conns: 1},
	{name: "splice", scenario: "splice", conns: 1},
	{name: "nonblock_eagain", scenario: "nonblock_eagain", conns: 2, backpressure: 1},
	{name: "stuck_nonblock", scenario: "stuck_nonblock", conns: 2, backpressure: 1},
	{name: "stuck_blocking", scenario: "stuck_blocking", conns: 2, backpressure: 1},
	{name: "recv_wakeup", scenario: "recv_wakeup", conns: 1},
	// Last: after its first splice the probe server's process is never a
	// reader again (ez_sc_splicers), so its connections stay on the kernel path.
	{name: "splice_read", scenario: "splice_read", conns: 1, splices: true},
}

// probeServe starts `eztunnel workload probe-server` in pod and waits until it listens.
// It returns the server's stderr, where it reports the spurious EAGAINs its
// blocking read loops retried.
func (e *env) probeServe(p *netlab.Pod, port int) *logbuf.Buffer {
	e.t.Helper()
	return probeServe(e.t, p, port)
}

// podRunner runs commands in a pod's network namespace and cgroup
// (netlab.Pod, multinode.Pod).
type podRunner interface {
	Cmd(ctx context.Context, name string, args ...string) *exec.Cmd
	Start(cmd *exec.Cmd) error
	Run(cmd *exec.Cmd) error
}

func probeServe(t *testing.T, p podRunner, port int) *logbuf.Buffer {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := p.Cmd(ctx, labBin, "workload", "probe-server", "--addr", ":"+strconv.Itoa(port), "--ready-file", ready)
	stderr := &logbuf.Buffer{}
	cmd.Stderr = stderr
	if err := p.Start(cmd); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if s := stderr.String(); s != "" {
			t.Logf("probe-server: %s", s)
		}
	})
	waitFile(t, ready, stderr.String)
	return stderr
}

// runProbe runs one probe scenario from p against addr and returns its observation.
func runProbe(t *testing.T, p podRunner, addr, scenario string) (map[string]any, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := p.Cmd(ctx, labBin, "workload", "probe", "--addr", addr, "--scenario", scenario)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := p.Run(cmd)
	if s := stderr.String(); s != "" {
		t.Logf("probe stderr: %s", s)
	}
	out := stdout.String()
	if err != nil {
		if strings.Contains(stderr.String(), "connection refused") {
			// Who listens in the client's namespace (the loopback cases'
			// server runs there), to tell a dead server from a refused SYN.
			ss := p.Cmd(ctx, "ss", "-tanpi")
			diag, _ := ss.CombinedOutput()
			t.Logf("refused: sockets in the client's namespace:\n%s", diag)
		}
		t.Fatalf("probe %s: %v\n%s", scenario, err, out)
	}
	var obs map[string]any
	if err := json.Unmarshal([]byte(out), &obs); err != nil {
		t.Fatalf("observation %q: %v", out, err)
	}
	return obs, strings.TrimSpace(out)
}

// spuriousLines returns the server's spurious-EAGAIN reports.
func spuriousLines(b *logbuf.Buffer) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "spurious EAGAIN") {
			out = append(out, l)
		}
	}
	return out
}

// spuriousEAGAIN is the divergence behind recv_wakeup as it shows in every
// other scenario: on an accelerated socket a blocking read woken without
// data (the peer's FIN, a signal) returns EAGAIN, which the probe's read
// loops count and retry. It may differ from plain TCP (always 0) only on
// accelerated connections; unmanaged peers and plain TCP must report 0.
const spuriousEAGAINReason = "tcp_msg_wait_data returns after one wakeup without data and tcp_bpf_recvmsg answers EAGAIN even on a blocking socket (see recv_wakeup)"

// oldFIONREADReason is the divergence of kernels without tcp_bpf_ioctl
// (docs/kernels.md): FIONREAD counts only the TCP receive queue.
const oldFIONREADReason = "without tcp_bpf_ioctl (Linux 6.15, Debian's 6.12.75) FIONREAD is tcp_inq(): bytes redirected into the psock queue are not counted until read"

// psockFIONREAD reports whether the kernel's FIONREAD sees the psock queue:
// its BTF has tcp_bpf_ioctl.
func psockFIONREAD(t *testing.T) bool {
	t.Helper()
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	var fn *btf.Func
	return spec.TypeByName("tcp_bpf_ioctl", &fn) == nil
}

// TestSemantics runs every probe scenario on plain TCP, then accelerated, and
// requires the application to observe exactly the same results, except for
// the fields listed in kernelDivergences (logged loudly); accelerated runs
// must actually have been redirected (or, with an unmanaged peer, not).
func TestSemantics(t *testing.T) {
	e := newEnv(t, "sem", 12)
	a, b, u := e.pod("a", true), e.pod("b", true), e.pod("u", false)
	srvB := e.probeServe(b, probePort)
	srvU := e.probeServe(u, probePort)
	e.probeServe(a, probePort) // the loopback cases' server, in the client's pod

	addr := func(c semCase) string {
		if c.loopback {
			return hostport(netip.MustParseAddr("127.0.0.1"), probePort)
		}
		srv := b
		if c.unmanagedPeer {
			srv = u
		}
		if c.v6 {
			return hostport(srv.IPv6, probePort)
		}
		return hostport(srv.IPv4, probePort)
	}
	probe := func(t *testing.T, c semCase) (map[string]any, string) {
		t.Helper()
		return runProbe(t, a, addr(c), c.scenario)
	}

	baseline := map[string]map[string]any{}
	t.Run("baseline", func(t *testing.T) {
		for _, c := range semCases {
			t.Run(c.name, func(t *testing.T) {
				obs, raw := probe(t, c)
				t.Logf("plain: %s", raw)
				if v, ok := obs[workload.SpuriousEAGAINField]; !ok || v != float64(0) {
					t.Errorf("plain TCP: %s = %v, want 0 (a blocking socket never returns EAGAIN)", workload.SpuriousEAGAINField, v)
				}
				baseline[c.name] = obs
			})
		}
		for _, srv := range []*logbuf.Buffer{srvB, srvU} {
			if l := spuriousLines(srv); len(l) > 0 {
				t.Errorf("plain TCP: the probe server saw spurious EAGAINs: %v", l)
			}
		}
	})

	e.accelerate()
	t.Run("accelerated", func(t *testing.T) {
		for _, c := range semCases {
			t.Run(c.name, func(t *testing.T) {
				before := e.counters()
				obs, raw := probe(t, c)
				d := delta(before, e.counters())
				t.Logf("accelerated: %s", raw)
				if c.unmanagedPeer {
					if d["pairs"] != 0 || d["bytes_redirected"] != 0 {
						t.Errorf("connection to an unmanaged pod was accelerated: %v", d)
					}
				} else if d["pairs"] != c.conns || d["bytes_redirected"] == 0 {
					t.Errorf("want %d pair(s) and redirected bytes, so the comparison means something: %v", c.conns, d)
				}
				wantBP := c.backpressure
				if wantBP > 0 && kernelBP(t, e) {
					wantBP = 0 // the kernel held the writer on the shortcut
				}
				if d["fallback_backpressure"] != wantBP {
					t.Errorf("want %d connection(s) switched for backpressure: %v", wantBP, d)
				}
				resetOff, _ := e.dp.Parts().Get(parts.CloseReset)
				if c.resets > 0 && !resetOff.Runs {
					// This kernel cannot give RST on close (docs/kernels.md):
					// the part says so, and nothing is armed; the close is a FIN.
					if resetOff.Reason == "" || d["close_resets_armed"] != 0 {
						t.Errorf("close-reset is off without a reason, or armed anyway: %+v %v", resetOff, d)
					}
					t.Logf("KNOWN KERNEL LIMIT (Linux %s): RST on close is off: %s", kernelRelease(t), resetOff.Reason)
					return
				}
				if c.splices && d["splice_stranded"] == 1 {
					// The stranded bytes stay in the server's psock (only
					// recvmsg reads them): its close, after the client's,
					// resets, and may come after the counters were read.
					if d["close_resets_armed"] > 1 || d["close_resets_sent"] > d["close_resets_armed"] {
						t.Errorf("want at most the stranding server's FIN sent as RST: %v", d)
					}
				} else if d["close_resets_armed"] != c.resets || d["close_resets_sent"] != c.resets {
					t.Errorf("want %d FIN(s) sent as RST (closed with redirected bytes unread): %v", c.resets, d)
				}
				want, ok := baseline[c.name]
				if !ok {
					t.Fatal("no baseline observation")
				}
				if c.splices {
					// The connection switches once: at the splice, or, when
					// the client's 1 MiB and shutdown(SHUT_WR) both ran
					// before the server's splice (a loaded CPU), at the
					// half close (sockops.h on_half_close), and the splice
					// then finds its bytes stranded.
					switch {
					case d["fallback_splice"] == 1 && d["fallback_half_close"] == 0:
					case d["fallback_splice"] == 0 && d["fallback_half_close"] == 1 && d["splice_stranded"] == 1:
						t.Logf("MEASURED the client's half close switched the connection before the server's splice")
					default:
						t.Errorf("want the connection switched once, at the splice (fallback_splice 1) or at the client's half close before a splice that found its bytes stranded: %v", d)
					}
					if d["splice_stranded"] == 0 && !reflect.DeepEqual(obs, want) {
						t.Errorf("nothing stranded, yet observations differ from plain TCP:\n%s", diffObs(want, obs))
						return
					}
					t.Logf("MEASURED splice_stranded %d", d["splice_stranded"])
				}
				if reflect.DeepEqual(obs, want) {
					return
				}
				if kernelReceiveFixed(t) {
					// kernel/patches: tcp_bpf's receive path reads as
					// plain TCP's; no divergence is known any more.
					t.Errorf("observations differ from plain TCP on a kernel with kernel/patches:\n%s", diffObs(want, obs))
					return
				}
				known, isKnown := kernelDivergences[c.name]
				allowed := known.fields
				if !psockFIONREAD(t) {
					// Linux 6.1 (and 6.12 before .75): no tcp_bpf_ioctl.
					var f []string
					for k := range obs {
						if strings.Contains(k, "fionread") && !reflect.DeepEqual(obs[k], want[k]) {
							f = append(f, k)
						}
					}
					if len(f) > 0 {
						allowed = append(slices.Clone(allowed), f...)
						t.Logf("KNOWN KERNEL DIVERGENCE (Linux %s, no tcp_bpf_ioctl): %s: %v", kernelRelease(t), oldFIONREADReason, f)
						if len(allowed) == len(f) {
							isKnown = true
						}
					}
				}
				if !c.unmanagedPeer && obs[workload.SpuriousEAGAINField] != want[workload.SpuriousEAGAINField] {
					allowed = append(slices.Clone(allowed), workload.SpuriousEAGAINField)
					t.Logf("KNOWN KERNEL DIVERGENCE (Linux %s, tcp_bpf): %s: %v", kernelRelease(t), spuriousEAGAINReason, obs[workload.SpuriousEAGAINField])
					if len(allowed) == 1 {
						isKnown = true
					}
				}
				if extra := unexpectedFields(want, obs, allowed); !isKnown || len(extra) > 0 {
					t.Errorf("observations differ from plain TCP (fields %v beyond the known kernel divergence):\n%s", extra, diffObs(want, obs))
					return
				}
				t.Logf("KNOWN KERNEL DIVERGENCE (Linux %s, tcp_bpf), documented in docs/families/shortcut-design.md: %s\n%s", kernelRelease(t), known.reason, diffObs(want, obs))
			})
		}
		// Never accelerated: its server must not see the divergence.
		if l := spuriousLines(srvU); len(l) > 0 {
			t.Errorf("unmanaged pod's probe server saw spurious EAGAINs: %v", l)
		}
		if l := spuriousLines(srvB); len(l) > 0 {
			t.Logf("KNOWN KERNEL DIVERGENCE on the accelerated server side: %s: %v", spuriousEAGAINReason, l)
		}
	})
}

// kernelDivergences are the observations that differ from plain TCP because
// of the kernel's sockmap receive path (net/ipv4/tcp_bpf.c) on this kernel,
// with no workaround that keeps each direction on one path and never exposes
// the FIONREAD bug. Only these fields may differ; anything else fails.
var kernelDivergences = map[string]struct {
	fields []string
	reason string
}{
	"waitall": {[]string{"waitall", "rest"},
		"tcp_bpf_recvmsg copies what the psock queue holds once and ignores MSG_WAITALL"},
	"splice_read": {[]string{"server"},
		"tcp_splice_read reads only sk_receive_queue: bytes redirected before the server's first splice (it read its scenario line with recv, so it was a reader) stay in its psock queue, invisible to splice(socket -> pipe) (splice_stranded; once per process)"},
	"recv_wakeup": {[]string{"1_blocking_recv", "3_rest_to_eof"},
		"tcp_msg_wait_data returns after one wakeup without data (a state change, or a signal such as Go's SIGURG preemption) and tcp_bpf_recvmsg answers EAGAIN even on a blocking socket"},
}

// unexpectedFields lists the differing fields not in allowed.
func unexpectedFields(plain, accel map[string]any, allowed []string) []string {
	var extra []string
	for k := range plain {
		if !reflect.DeepEqual(plain[k], accel[k]) && !slices.Contains(allowed, k) {
			extra = append(extra, k)
		}
	}
	for k := range accel {
		if _, ok := plain[k]; !ok && !slices.Contains(allowed, k) {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	return extra
}

func kernelRelease(t *testing.T) string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return "?"
	}
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// diffObs lists the fields whose values differ, "plain -> accelerated".
func diffObs(plain, accel map[string]any) string {
	keys := map[string]bool{}
	for k := range plain {
		keys[k] = true
	}
	for k := range accel {
		keys[k] = true
	}
	var names []string
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, k := range names {
		p, pok := plain[k]
		a, aok := accel[k]
		if pok && aok && reflect.DeepEqual(p, a) {
			continue
		}
		pj, _ := json.Marshal(p)
		aj, _ := json.Marshal(a)
		if !pok {
			pj = []byte("(absent)")
		}
		if !aok {
			aj = []byte("(absent)")
		}
		sb.WriteString("  " + k + ": " + string(pj) + " -> " + string(aj) + "\n")
	}
	return sb.String()
}
