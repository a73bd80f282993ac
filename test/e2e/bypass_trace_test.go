package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// TestBypassTraceSavedStages: `eztunnel trace` in a node's namespace while
// the agent's bridge bypass carries a UDP echo between two of its pods. The
// first datagrams take the kernel path (bridge, the node's netfilter), the
// admitted ones the bypass: the trace shows both paths, and the bypassed
// one's saved stages include the bridge's transmit to the receiving pod.
func TestBypassTraceSavedStages(t *testing.T) {
	l := newMultinode(t, multinode.Options{Name: "mnbt", Nodes: 1})
	n := l.Node(1)
	a1, a2 := mnPod(t, n, "a1"), mnPod(t, n, "a2")
	setBeLiberal(t, n, "1")
	nodeTalksTo(t, a1)
	nodeTalksTo(t, a2)
	pin := "/sys/fs/bpf/eztunnel-e2e-mnbt"
	uninstallOnCleanup(t, n, pin)
	type path struct {
		Stages  []string `json:"stages"`
		Packets int      `json:"packets"`
		Saved   []string `json:"saved"`
	}
	// trace runs `eztunnel trace` in the node while 200 UDP echoes run
	// between a1 and a2 and returns its paths and the datagrams the bypass
	// counted (mc nil: no agent).
	trace := func(what string, mc *http.Client) (paths []path, bypassed float64) {
		t.Helper()
		pc := listenUDPIn(t, a2, false)
		defer pc.Close()
		port := strings.TrimPrefix(pc.LocalAddr().String(), a2.IPv4.String()+":")
		ready := filepath.Join(t.TempDir(), "trace-ready")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tr := n.Cmd(ctx, bin, "trace", "-o", "json", "--proto", "udp", "--port", port, "--ready-file", ready)
		var out bytes.Buffer
		errb := &logbuf.Buffer{}
		tr.Stdout, tr.Stderr = &out, errb
		if err := n.Start(tr); err != nil {
			t.Fatal(err)
		}
		defer tr.Wait()
		waitFile(t, ready, errb.String)
		var before float64
		if mc != nil {
			before = scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"]
		}
		udpEchoOn(t, a1, pc, 200)
		if mc != nil {
			bypassed = scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"] - before
		}
		tr.Process.Signal(syscall.SIGINT)
		if err := tr.Wait(); err != nil {
			t.Fatalf("%s: trace: %v: %s", what, err, errb.String())
		}
		var sum struct {
			Packets int    `json:"packets"`
			Paths   []path `json:"paths"`
		}
		if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
			t.Fatalf("%s: trace summary %q: %v", what, out.String(), err)
		}
		t.Logf("%s: %d packets, %v bypassed, paths %+v", what, sum.Packets, bypassed, sum.Paths)
		return sum.Paths, bypassed
	}
	// viaBridge: lifetimes the bridge sent to the receiving pod's veth.
	viaBridge := func(ps []path) (n int) {
		for _, p := range ps {
			if slices.Contains(p.Stages, "h_xmit") {
				n += p.Packets
			}
		}
		return n
	}

	// The kernel path alone: every datagram is sent by the bridge.
	base, _ := trace("bridge", nil)
	if b := viaBridge(base); b < 400 {
		t.Fatalf("without the bypass %d of 400 datagrams seen at h_xmit: the trace does not see the bridge", b)
	}

	startNodeAgent(t, t, n, "run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
		"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false", "--metrics-addr", bpMetricsAddr)
	mc := nodeClient(n)
	waitMetrics(t, mc, "a1 and a2 discovered", func(m map[string]float64) bool {
		return m["eztunnel_bypass_devices"] == 2 && m["eztunnel_bypass_endpoints"] == 4
	})
	paths, bypassed := trace("bypass", mc)
	if bypassed < 100 {
		t.Fatalf("%v datagrams bypassed of 400: the trace would show nothing", bypassed)
	}
	saved := false
	for _, p := range paths {
		if slices.Contains(p.Saved, "h_xmit") && slices.Contains(p.Saved, "h_nf_fwd") && slices.Contains(p.Stages, "h_recv") {
			saved = true
		}
	}
	// The bypassed datagrams no longer reach h_xmit (the echo's datagrams
	// above the MTU are IP fragments: they take the kernel path, and
	// conntrack's reassembly splits each in several lifetimes, so the count
	// is not exact).
	if b := viaBridge(paths); !saved || float64(b) > 400-bypassed/2 {
		t.Errorf("with %v of 400 datagrams bypassed: %d lifetimes through the bridge, a path that saved h_xmit and h_nf_fwd after h_recv: %v", bypassed, b, saved)
	}
}
