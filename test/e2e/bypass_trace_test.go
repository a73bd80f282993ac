package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

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
	startNodeAgent(t, t, n, "run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
		"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false", "--metrics-addr", bpMetricsAddr)
	mc := nodeClient(n)
	waitMetrics(t, mc, "a1 and a2 discovered", func(m map[string]float64) bool {
		return m["eztunnel_bypass_devices"] == 2 && m["eztunnel_bypass_endpoints"] == 4
	})

	pc := listenUDPIn(t, a2, false)
	defer pc.Close()
	port := strings.TrimPrefix(pc.LocalAddr().String(), a2.IPv4.String()+":")
	ready := filepath.Join(t.TempDir(), "trace-ready")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := n.Cmd(ctx, bin, "trace", "-o", "json", "--proto", "udp", "--port", port, "--ready-file", ready)
	var out bytes.Buffer
	errb := &lockedBuffer{}
	tr.Stdout, tr.Stderr = &out, errb
	if err := n.Start(tr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); tr.Wait() })
	waitFile(t, ready, errb.String)

	before := scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"]
	udpEchoOn(t, a1, pc, 200)
	if d := scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"] - before; d < 100 {
		t.Fatalf("%v datagrams bypassed of 400: the trace would show nothing", d)
	}
	tr.Process.Signal(syscall.SIGINT)
	if err := tr.Wait(); err != nil {
		t.Fatalf("trace: %v: %s", err, errb.String())
	}
	var sum struct {
		Packets int `json:"packets"`
		Paths   []struct {
			Stages  []string `json:"stages"`
			Packets int      `json:"packets"`
			Saved   []string `json:"saved"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("trace summary %q: %v", out.String(), err)
	}
	t.Logf("trace: %d packets, paths %+v", sum.Packets, sum.Paths)
	var bypassed int
	for _, p := range sum.Paths {
		if slices.Contains(p.Saved, "h_xmit") && !slices.Contains(p.Stages, "h_xmit") {
			bypassed += p.Packets
		}
	}
	if len(sum.Paths) < 2 || bypassed < 100 {
		t.Errorf("paths %+v: want the kernel path and a bypassed one (at least 100 packets) that saved h_xmit", sum.Paths)
	}
}
