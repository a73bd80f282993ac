package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// The RST on close (bpf/shortcut/closereset.h) as the agent runs it in a
// node's namespace: pods created after the agent started get their veths
// attached (netlink), a connection closed with redirected bytes unread ends
// exactly as plain TCP's (the peer reads ECONNRESET), the device links are
// pinned and kept across a restart without being attached twice, a removed
// pod's links go, and uninstall leaves no program on any device.

// closeResetTCX lists, per device of n, the ez_sc_close_reset programs
// attached with tcx ("<direction>#<program id>").
func closeResetTCX(t *testing.T, n *multinode.Node) map[string][]string {
	t.Helper()
	return closeResetTCXIn(t, n.NetNS, n.Handle)
}

// closeResetTCXIn is closeResetTCX for the named netns; ez_sc_close_reset
// must be first in every chain it is in.
func closeResetTCXIn(t *testing.T, netns string, handle func() (*netlink.Handle, error)) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range tcxChains(t, netns, handle) {
		// A legacy filter keeps the name it had before the family prefix.
		if p.Name != "ez_sc_close_reset" && p.Name != "ez_close_reset" {
			continue
		}
		if p.Pos != 0 {
			t.Errorf("ez_sc_close_reset is %d in the tcx %s chain of %s, want first", p.Pos, p.Dir, p.Dev)
		}
		out[p.Dev] = append(out[p.Dev], fmt.Sprintf("%s#%d", p.Dir, p.ID))
	}
	return out
}

// directions strips the program ids of closeResetTCX's entries.
func directions(on []string) []string {
	var out []string
	for _, e := range on {
		d, _, _ := strings.Cut(e, "#")
		out = append(out, d)
	}
	slices.Sort(out)
	return out
}

// TestCloseResetAgent runs the way this kernel chooses (tcx links where it
// has them, else legacy tc filters; reads counted where a counter loads),
// and as on a Linux 6.1 that refuses fexit on every kernel: legacy tc
// filters (clsact + cls_bpf; EZTUNNEL_TEST_LEGACY_TC=1 where tcx exists) and
// the gauge (both read counters refused), where a closing socket's unread
// bytes are its own sk_rmem_alloc.
func TestCloseResetAgent(t *testing.T) {
	t.Run("native", func(t *testing.T) { closeResetAgent(t, "mncr") })
	t.Run("legacy-tc-gauge", func(t *testing.T) {
		t.Setenv("EZTUNNEL_TEST_LEGACY_TC", "1")
		t.Setenv(bpfsys.TestRefuseEnv, refuseReads)
		closeResetAgent(t, "mncl")
	})
}

// nodeProc runs commands in a node's network namespace and the given
// cgroup (podRunner): under n.Managed it is a hostNetwork pod's process.
type nodeProc struct {
	n      *multinode.Node
	cgroup string
}

func (p *nodeProc) Cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	return p.n.Cmd(ctx, name, args...)
}
func (p *nodeProc) Start(cmd *exec.Cmd) error { return netlab.StartInCgroup(cmd, p.cgroup) }
func (p *nodeProc) Run(cmd *exec.Cmd) error   { return netlab.RunInCgroup(cmd, p.cgroup) }

// resetPin is where ez_sc_close_reset's attachment at dev ifx, direction dir,
// in the netns with that cookie is pinned: a tcx link, or a legacy filter's
// record.
func resetPin(dir string, cookie uint64, ifx int, direction string) string {
	if bpfsys.UseTCX() {
		return bpfsys.LinkPin(dir, bpfsys.KindTCX, fmt.Sprint(cookie), fmt.Sprint(ifx), "ez_sc_close_reset_"+direction)
	}
	return bpfsys.TCRecord(dir, cookie, bpfsys.TCFilter{Ifindex: ifx, Ingress: direction == "ingress", Name: "ez_close_reset"})
}

func closeResetAgent(t *testing.T, name string) {
	// No full scan of the managed cgroups' processes after the start: a
	// pod's loopback gets the program only because its first handshakes
	// asked for its namespace (bpf/shortcut/coverage.h).
	t.Setenv("EZTUNNEL_TEST_LOOPBACK_SCAN", "1h")
	l := newMultinode(t, multinode.Options{Name: name, Nodes: 1})
	n := l.Node(1)
	pin := "/sys/fs/bpf/eztunnel-e2e-" + name
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = pin
	uninstall := func(t *testing.T) {
		var out bytes.Buffer
		cmd := n.Cmd(context.Background(), bin, "uninstall", "--pin-path", pin, "--drain-timeout", "5s")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n.Run(cmd); err != nil {
			t.Errorf("uninstall: %v: %s", err, out.String())
		}
	}
	t.Cleanup(func() {
		if _, err := os.Stat(pin); err == nil {
			uninstall(t)
		}
	})
	lock := filepath.Join(t.TempDir(), "agent.lock")
	args := []string{"run", "--cgroup", n.Managed, "--pin-path", pin, "--lock-file", lock, "--adopt=false"}
	ag := startNodeAgent(t, t, n, args...)
	// The agent runs the way this subtest says (the switches are inherited).
	rep := statusParts(t, pin)
	reset, read := partOf(t, rep.Parts, parts.CloseReset), partOf(t, rep.Parts, parts.ReadAccounting)
	noCounter := bpfsys.Fexit("tcp_bpf_recvmsg")() != nil && bpfsys.Tracepoint("sock_recv_length")() != nil
	legacy, gauge := !bpfsys.UseTCX(), os.Getenv(bpfsys.TestRefuseEnv) == refuseReads || noCounter
	if !reset.Runs || strings.Contains(reset.Via, "legacy tc") != legacy || strings.Contains(read.Via, "gauge") != gauge {
		t.Fatalf("parts: %+v and %+v, want close-reset running with legacy tc %v, reads gauged %v", reset, read, legacy, gauge)
	}
	if !gauge {
		checkReadHook(t, read)
	}

	// Pods made after the agent: discovered from netlink.
	a, b := mnPod(t, n, "a"), mnPod(t, n, "b")
	u, err := n.AddPod("u", false) // outside the managed cgroups: plain TCP
	if err != nil {
		t.Fatal(err)
	}
	// Each veth at ingress (what its pod sends), the pods' bridge at
	// egress (what the node's namespace sends to a pod), lo at egress.
	want := map[string][]string{"lo": {"egress"}, n.Bridge: {"egress"}}
	for _, p := range []*multinode.Pod{a, b, u} {
		want[p.HostVeth] = []string{"ingress"}
	}
	waitAttached := func(t *testing.T, what string, want map[string][]string) map[string][]string {
		t.Helper()
		var on map[string][]string
		for deadline := time.Now().Add(scaled(20 * time.Second)); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			on = closeResetTCX(t, n)
			got := map[string][]string{}
			for dev, e := range on {
				got[dev] = directions(e)
			}
			if reflect.DeepEqual(got, want) {
				return on
			}
		}
		t.Fatalf("%s: ez_sc_close_reset on %v, want %v\nagent:\n%s", what, on, want, ag.logs.String())
		return nil
	}
	attached := waitAttached(t, "pods added after the agent", want)

	probeServe(t, b, probePort)
	probeServe(t, u, probePort)
	counters := func() datapath.Counters { return pinnedCounters(t, pin) }
	// closeUnreadFrom runs close_unread from pod a against each family's
	// address of an unmanaged server (plain TCP) and of a managed one:
	// the accelerated run must pair, arm and send one RST, and observe
	// what plain TCP did.
	closeUnreadFrom := func(t *testing.T, what string, plainAt, accelAt func(v6 bool) string) {
		t.Helper()
		for _, v6 := range []bool{false, true} {
			plain, raw := runProbe(t, a, plainAt(v6), "close_unread")
			t.Logf("%s plain (%s, unmanaged server): %s", family(v6), what, raw)
			before := counters()
			accel, raw := runProbe(t, a, accelAt(v6), "close_unread")
			d := delta(before, counters())
			t.Logf("%s accelerated (%s): %s", family(v6), what, raw)
			if d["pairs"] != 1 || d["bytes_redirected"] == 0 {
				t.Errorf("%s %s: not accelerated, the comparison means nothing: %v", family(v6), what, d)
			}
			if d["close_resets_armed"] != 1 || d["close_resets_sent"] != 1 {
				t.Errorf("%s %s: want the server's FIN armed and sent as RST once: %v", family(v6), what, d)
			}
			if plain["3_read"] != "ECONNRESET" {
				t.Errorf("%s plain TCP: 3_read = %v, want ECONNRESET (the scenario is wrong)", family(v6), plain["3_read"])
			}
			if !reflect.DeepEqual(plain, accel) {
				t.Errorf("%s %s: accelerated observations differ from plain TCP:\n%s", family(v6), what, diffObs(plain, accel))
			}
		}
	}
	closeUnread := func(t *testing.T) {
		t.Helper()
		closeUnreadFrom(t, "a -> b",
			func(v6 bool) string { return hostport(u.Addr(v6), probePort) },
			func(v6 bool) string { return hostport(b.Addr(v6), probePort) })
	}
	t.Run("close-unread", closeUnread)

	t.Run("node-closes", func(t *testing.T) {
		// A managed process of the node's own namespace (a hostNetwork
		// pod) closes with unread bytes: its FIN leaves through the
		// bridge device and a's veth, and is rewritten at the bridge's
		// egress. The plain run: the same server outside the managed
		// cgroups.
		nodeServers(t, n)
		gw := func(v6 bool) netip.Addr {
			if v6 {
				return n.GatewayV6
			}
			return n.GatewayV4
		}
		closeUnreadFrom(t, "a -> node",
			func(v6 bool) string { return hostport(gw(v6), probePort+3) },
			func(v6 bool) string { return hostport(gw(v6), probePort+2) })
	})

	t.Run("pod-loopback", func(t *testing.T) {
		// An application and its sidecar: both ends in one pod, over its
		// own loopback. The agent attached a's loopback when a's first
		// handshakes (close-unread's) asked for its namespace: it scans
		// the managed cgroups' processes only then in this test.
		probeServe(t, a, probePort)
		cookie, err := bpfsys.NetNSCookie(a.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		loPin := resetPin(cfg.Dir(), cookie, 1, "egress")
		for deadline := time.Now().Add(scaled(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
			if _, err := os.Stat(loPin); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not pinned: the agent did not attach to a's loopback\n%s", loPin, ag.logs.String())
			}
		}
		if on := closeResetTCXIn(t, a.NetNS, a.Handle); !reflect.DeepEqual(directions(on["lo"]), []string{"egress"}) || len(on) != 1 {
			t.Errorf("tcx in pod a: %v, want ez_sc_close_reset at lo's egress only", on)
		}
		lo := netip.MustParseAddr("127.0.0.1")
		probeServe(t, u, probePort+1)
		plain, raw := runProbe(t, u, hostport(lo, probePort+1), "close_unread")
		t.Logf("plain (unmanaged u, loopback): %s", raw)
		before := counters()
		accel, raw := runProbe(t, a, hostport(lo, probePort), "close_unread")
		d := delta(before, counters())
		t.Logf("accelerated (a, loopback): %s", raw)
		if d["pairs"] != 1 || d["close_resets_armed"] != 1 || d["close_resets_sent"] != 1 || d["close_reset_uncovered_sockets"] != 0 {
			t.Errorf("want one pair of a covered namespace and its FIN armed and sent as RST: %v", d)
		}
		if !reflect.DeepEqual(plain, accel) {
			t.Errorf("accelerated observations differ from plain TCP:\n%s", diffObs(plain, accel))
		}
	})

	parent := t
	t.Run("restart-keeps-links", func(t *testing.T) {
		ag.stop(t)
		if on := closeResetTCX(t, n); !reflect.DeepEqual(on, attached) {
			t.Errorf("with the agent stopped: %v, want the pinned links %v", on, attached)
		}
		ag = startNodeAgent(t, parent, n, args...)
		// Updated in place: one program per device and direction.
		after := waitAttached(t, "after the restart", want)
		for dev, on := range after {
			if len(on) != len(attached[dev]) {
				t.Errorf("%s: %v after the restart, was %v", dev, on, attached[dev])
			}
		}
		closeUnread(t)
	})

	t.Run("pod-removed", func(t *testing.T) {
		h, err := n.Handle()
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		lk, err := h.LinkByName(u.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		ifx := lk.Attrs().Index
		nodeCookie, err := bpfsys.NetNSCookie(n.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		gone := resetPin(cfg.Dir(), nodeCookie, ifx, "ingress")
		if !bpfsys.Exists(gone) {
			t.Fatalf("%s is not pinned before u's veth is removed", gone)
		}
		if err := h.LinkDel(lk); err != nil {
			t.Fatal(err)
		}
		delete(want, u.HostVeth)
		waitAttached(t, "u's veth removed", want)
		for deadline := time.Now().Add(scaled(20 * time.Second)); ; time.Sleep(100 * time.Millisecond) {
			if !bpfsys.Exists(gone) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the removed veth's attachment is still pinned: %v", gone)
			}
		}
	})

	t.Run("first-handshake", func(t *testing.T) {
		// A pod made while the agent runs: its first connection over its
		// loopback asks for its namespace, and the agent attaches there.
		d, lo, pin := loopbackPod(t, n, cfg, "d")
		before := counters()
		start := time.Now()
		runProbe(t, d, lo, "close_unread")
		waitPinned(t, pin, ag.logs.String)
		t.Logf("d's loopback attached %v after its first connection began; that connection's sockets enrolled uncovered: %d", time.Since(start).Round(time.Millisecond), delta(before, counters())["close_reset_uncovered_sockets"])
		coveredCloseUnread(t, d, lo, counters)
	})

	t.Run("pod-of-a-stopped-agent", func(t *testing.T) {
		ag.stop(t)
		c, lo, pin := stoppedAgentPod(t, n, cfg, counters)
		ag = startNodeAgent(t, parent, n, args...)
		// The new agent's start scans the managed cgroups' processes.
		waitPinned(t, pin, ag.logs.String)
		coveredCloseUnread(t, c, lo, counters)
	})

	t.Run("uninstall", func(t *testing.T) {
		ag.stop(t)
		uninstall(t)
		if on := closeResetTCX(t, n); len(on) > 0 {
			t.Errorf("after uninstall: %v", on)
		}
		if on := closeResetTCXIn(t, a.NetNS, a.Handle); len(on) > 0 {
			t.Errorf("after uninstall, in pod a: %v", on)
		}
	})
}

// nodeServers starts probe servers in n's own namespace: a managed one (a
// hostNetwork pod's process) at probePort+2, an unmanaged one at
// probePort+3.
func nodeServers(t *testing.T, n *multinode.Node) {
	t.Helper()
	host := &nodeProc{n: n, cgroup: filepath.Join(n.Managed, "host")}
	if err := os.Mkdir(host.cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(host.cgroup) })
	probeServe(t, host, probePort+2)
	probeServe(t, &nodeProc{n: n, cgroup: n.System}, probePort+3)
}

// stoppedAgentPod: with the agent stopped its programs still run, and a pod
// made meanwhile (c, in the managed cgroups) has connections accelerated
// over its own loopback, which nobody attaches: both ends are counted
// enrolled in an uncovered namespace (close_reset_uncovered_sockets), and a
// close with unread bytes sends FIN, not RST: the gap the counter names.
func stoppedAgentPod(t *testing.T, n *multinode.Node, cfg datapath.Config, counters func() datapath.Counters) (c *multinode.Pod, lo, pin string) {
	t.Helper()
	c, lo, pin = loopbackPod(t, n, cfg, "c")
	before := counters()
	obs, raw := runProbe(t, c, lo, "close_unread")
	d := delta(before, counters())
	t.Logf("accelerated (c, loopback, agent stopped): %s", raw)
	if d["pairs"] != 1 || d["close_reset_uncovered_sockets"] != 2 || d["close_resets_sent"] != 0 {
		t.Errorf("want one pair, both ends counted uncovered, no RST sent: %v", d)
	}
	if obs["3_read"] == "ECONNRESET" {
		t.Errorf("c's loopback carries no program, yet the close was a reset: %v", obs)
	}
	if bpfsys.Exists(pin) {
		t.Errorf("c's loopback attached with the agent stopped")
	}
	return c, lo, pin
}

// loopbackPod makes pod name on n with the probe server on its own
// loopback: the pod, the server's address, and where the close reset's
// attachment at the pod's loopback is pinned.
func loopbackPod(t *testing.T, n *multinode.Node, cfg datapath.Config, name string) (p *multinode.Pod, lo, pin string) {
	t.Helper()
	p = mnPod(t, n, name)
	probeServe(t, p, probePort)
	cookie, err := bpfsys.NetNSCookie(p.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	return p, hostport(netip.MustParseAddr("127.0.0.1"), probePort), resetPin(cfg.Dir(), cookie, 1, "egress")
}

// coveredCloseUnread runs close_unread from p to lo, its own loopback,
// which the agent covers: one pair, its FIN sent as RST, the peer reads
// ECONNRESET, nothing counted uncovered.
func coveredCloseUnread(t *testing.T, p *multinode.Pod, lo string, counters func() datapath.Counters) {
	t.Helper()
	before := counters()
	obs, raw := runProbe(t, p, lo, "close_unread")
	d := delta(before, counters())
	t.Logf("accelerated (%s, loopback, covered): %s", p.Name, raw)
	if d["pairs"] != 1 || d["close_resets_sent"] != 1 || d["close_reset_uncovered_sockets"] != 0 || obs["3_read"] != "ECONNRESET" {
		t.Errorf("want one pair of a covered namespace, its FIN sent as RST, ECONNRESET: %v, %v", d, obs)
	}
}

// waitPinned waits until pin exists (logs: the agent's, for the failure).
func waitPinned(t *testing.T, pin string, logs func() string) {
	t.Helper()
	for deadline := time.Now().Add(scaled(30 * time.Second)); !bpfsys.Exists(pin); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not pinned\n%s", pin, logs())
		}
	}
}
