package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// TestCloseResetCovered: with --close-reset-devices=covered (after an agent
// with the default, all: what it attached goes) the close reset is attached
// only where the managed cgroups' processes live (a pod's veth
// at ingress and its loopback; the node's loopback and bridge once a
// managed process lives in the node's namespace), never to an unmanaged
// pod's veth; and a socket enrols only in a covered namespace, so every
// connection ends as plain TCP's: one of an uncovered namespace stays on
// the kernel path (fallback uncovered), one of a covered namespace is
// accelerated and its FIN with bytes unread is sent as RST.
func TestCloseResetCovered(t *testing.T) {
	// No full scan after the start: coverage comes from the install's
	// scan and from first handshakes (bpf/shortcut/coverage.h).
	t.Setenv("EZTUNNEL_TEST_LOOPBACK_SCAN", "1h")
	l := newMultinode(t, multinode.Options{Name: "crcov", Nodes: 1})
	n := l.Node(1)
	pin := "/sys/fs/bpf/eztunnel-e2e-crcov"
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = pin
	t.Cleanup(func() {
		if _, err := os.Stat(pin); err == nil {
			var out bytes.Buffer
			cmd := n.Cmd(context.Background(), bin, "uninstall", "--pin-path", pin, "--drain-timeout", "5s")
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := n.Run(cmd); err != nil {
				t.Errorf("uninstall: %v: %s", err, out.String())
			}
		}
	})
	lock := filepath.Join(t.TempDir(), "agent.lock")
	args := []string{"run", "--cgroup", n.Managed, "--pin-path", pin, "--lock-file", lock, "--adopt=false", "--close-reset-devices", "covered"}
	a, b := mnPod(t, n, "a"), mnPod(t, n, "b")
	u, err := n.AddPod("u", false) // outside the managed cgroups
	if err != nil {
		t.Fatal(err)
	}
	// An agent with the default, all, attaches every pod's veth, the bridge
	// and lo; the next, told covered, converges to the covered devices.
	allArgs := append(slices.Clone(args[:len(args)-2]), "--close-reset-devices", "all")
	var ag *nodeAgent
	counters := func() datapath.Counters { return pinnedCounters(t, pin) }
	tcx := func() map[string][]string {
		got := map[string][]string{}
		for dev, e := range closeResetTCX(t, n) {
			got[dev] = directions(e)
		}
		return got
	}
	waitTCX := func(t *testing.T, what string, want map[string][]string) {
		t.Helper()
		var got map[string][]string
		for deadline := time.Now().Add(scaled(30 * time.Second)); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if got = tcx(); reflect.DeepEqual(got, want) {
				return
			}
		}
		t.Fatalf("%s: ez_sc_close_reset on %v, want %v\nagent:\n%s", what, got, want, ag.logs.String())
	}
	ag = startNodeAgent(t, t, n, allArgs...)
	all := map[string][]string{"lo": {"egress"}, n.Bridge: {"egress"}}
	for _, p := range []*multinode.Pod{a, b, u} {
		all[p.HostVeth] = []string{"ingress"}
	}
	waitTCX(t, "--close-reset-devices all", all)
	ag.stop(t)
	ag = startNodeAgent(t, t, n, args...)
	loPin := func(p *multinode.Pod) string {
		cookie, err := bpfsys.NetNSCookie(p.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		return resetPin(cfg.Dir(), cookie, 1, "egress")
	}
	// closeUnread runs close_unread from c against an unmanaged server
	// (plain TCP) and a managed one, and returns the managed run's counters.
	closeUnread := func(t *testing.T, c podRunner, plainAt, accelAt string) datapath.Counters {
		t.Helper()
		plain, raw := runProbe(t, c, plainAt, "close_unread")
		t.Logf("plain (unmanaged server %s): %s", plainAt, raw)
		if plain["3_read"] != "ECONNRESET" {
			t.Fatalf("plain TCP: 3_read = %v, want ECONNRESET (the scenario is wrong)", plain["3_read"])
		}
		before := counters()
		accel, raw := runProbe(t, c, accelAt, "close_unread")
		d := delta(before, counters())
		t.Logf("managed server %s: %s; counters %v", accelAt, raw, d)
		if !reflect.DeepEqual(plain, accel) {
			t.Errorf("observations differ from plain TCP:\n%s", diffObs(plain, accel))
		}
		return d
	}
	accelerated := func(t *testing.T, what string, d datapath.Counters) {
		t.Helper()
		if d["pairs"] != 1 || d["close_resets_armed"] != 1 || d["close_resets_sent"] != 1 || d["fallback_uncovered"] != 0 || d["close_reset_uncovered_sockets"] != 0 {
			t.Errorf("%s: want one pair, its FIN armed and sent as RST, nothing uncovered: %v", what, d)
		}
	}
	at := func(p *multinode.Pod) string { return hostport(p.Addr(false), probePort) }

	var c *multinode.Pod // a pod made while the agent runs
	parent := t
	// No managed process runs anywhere yet, and no end is in the sockhash:
	// no device carries the program any more.
	waitTCX(t, "no managed process", map[string][]string{})
	probeServe(t, b, probePort) // listening asks for nothing
	probeServe(t, u, probePort)

	t.Run("uncovered-stays-on-kernel-path", func(t *testing.T) {
		// The agent stopped: its programs run, and nobody covers a or b.
		ag.stop(t)
		d := closeUnread(t, a, at(u), at(b))
		if d["pairs"] != 0 || d["fallback_uncovered"] != 1 || d["close_resets_armed"] != 0 {
			t.Errorf("want the connection on the kernel path, its client counted uncovered once: %v", d)
		}
	})

	t.Run("install-covers-running-pods", func(t *testing.T) {
		probeServe(parent, a, probePort) // a process in a's namespace, to the end
		ag = startNodeAgent(t, parent, n, args...)
		waitTCX(t, "a and b run managed processes", map[string][]string{a.HostVeth: {"ingress"}, b.HostVeth: {"ingress"}})
		for _, p := range []*multinode.Pod{a, b} {
			if !bpfsys.Exists(loPin(p)) {
				t.Errorf("%s: %s not pinned", p.Name, loPin(p))
			}
		}
		if bpfsys.Exists(loPin(u)) {
			t.Errorf("the unmanaged pod's loopback carries the program: %s", loPin(u))
		}
		accelerated(t, "a -> b", closeUnread(t, a, at(u), at(b)))
	})

	t.Run("first-handshake-covers-a-new-pod", func(t *testing.T) {
		c = mnPod(t, n, "c")
		probeServe(parent, c, probePort) // listening asks for nothing
		// Its first connection asks for its namespace; whichever path it
		// took, it ends as plain TCP's.
		closeUnread(t, c, at(u), at(b))
		waitTCX(t, "c asked", map[string][]string{a.HostVeth: {"ingress"}, b.HostVeth: {"ingress"}, c.HostVeth: {"ingress"}})
		waitPinned(t, loPin(c), ag.logs.String)
		accelerated(t, "c -> b", closeUnread(t, c, at(u), at(b)))
	})

	t.Run("node-process", func(t *testing.T) {
		if c == nil {
			t.Fatal("needs pod c of first-handshake-covers-a-new-pod")
		}
		// A managed process of the node's namespace (a hostNetwork pod):
		// its first handshake covers the node's loopback and bridge.
		nodeServers(t, n)
		gw := hostport(n.GatewayV4, probePort+3)
		managed := hostport(n.GatewayV4, probePort+2)
		closeUnread(t, a, gw, managed)
		waitTCX(t, "a process in the node's namespace asked", map[string][]string{
			"lo": {"egress"}, n.Bridge: {"egress"}, a.HostVeth: {"ingress"}, b.HostVeth: {"ingress"}, c.HostVeth: {"ingress"}})
		accelerated(t, "a -> node", closeUnread(t, a, gw, managed))
		if on := tcx(); on[u.HostVeth] != nil {
			t.Errorf("the unmanaged pod's veth carries the program: %v", on)
		}
	})
}
