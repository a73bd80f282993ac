package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"

	"github.com/eztunnel/eztunnel/lab/multinode"
)

// TestBypassStandby: on a node where no rule uses conntrack (so it does not
// run), the bypass could bypass nothing (it admits only flows conntrack
// confirmed): the agent loads it but attaches it nowhere, and says so in
// its log, `eztunnel status` and eztunnel_bypass_standby; pod traffic takes
// the bridge and no packet pays for the bypass (no fallback counted). Once
// a rule that uses conntrack appears (here an nft ct state rule, as
// kube-proxy's or a CNI's would), the bypass attaches and bypasses.
func TestBypassStandby(t *testing.T) {
	l := newMultinode(t, multinode.Options{Name: "mnbs", Nodes: 1, NoFirewall: true})
	n := l.Node(1)
	a1, a2 := mnPod(t, n, "a1"), mnPod(t, n, "a2")
	setBeLiberal(t, n, "1")
	pin := "/sys/fs/bpf/eztunnel-e2e-mnbs"
	uninstallOnCleanup(t, n, pin)
	nodeTalksTo(t, a1)
	nodeTalksTo(t, a2)
	ag := startNodeAgent(t, t, n, "run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
		"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false", "--metrics-addr", bpMetricsAddr)
	mc := nodeClient(n)
	standby := func(m map[string]float64) (float64, string) {
		for k, v := range m {
			if r, ok := strings.CutPrefix(k, `eztunnel_bypass_standby{reason="`); ok {
				return v, strings.TrimSuffix(r, `"}`)
			}
		}
		return -1, ""
	}
	partStandby := func() string {
		var out bytes.Buffer
		cmd := n.Cmd(context.Background(), bin, "status", "--pin-path", pin, "-o", "json")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n.Run(cmd); err != nil {
			t.Fatalf("status: %v: %s", err, out.String())
		}
		var rep struct {
			Parts struct {
				Parts []struct {
					Part    string `json:"part"`
					Runs    bool   `json:"runs"`
					Standby string `json:"standby"`
				} `json:"parts"`
			} `json:"parts"`
		}
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("status json: %v: %s", err, out.String())
		}
		for _, p := range rep.Parts.Parts {
			if p.Part == "bypass" {
				if !p.Runs {
					t.Errorf("status: the bypass does not run: %s", out.String())
				}
				return p.Standby
			}
		}
		t.Fatalf("status: no bypass part: %s", out.String())
		return ""
	}

	m := waitMetrics(t, mc, "standing by", func(m map[string]float64) bool { v, _ := standby(m); return v == 1 })
	if _, why := standby(m); why != "conntrack_inactive" || m["eztunnel_bypass_devices"] != 0 {
		t.Fatalf("standby %q with %v devices attached, want the conntrack reason and none", why, m["eztunnel_bypass_devices"])
	}
	if on := bypassTCX(t, n); len(on) != 0 {
		t.Errorf("bypass programs attached while standing by: %v", on)
	}
	if why := partStandby(); !strings.Contains(why, "conntrack does not run") {
		t.Errorf("status: bypass standby %q", why)
	}
	if !strings.Contains(ag.logs.String(), "bypass: standing by") {
		t.Errorf("no standby warning in the log:\n%s", ag.logs.String())
	}
	before := scrapeWith(t, mc, bpMetricsAddr)
	transfer(t, a1, sinkServer(t, a2, false), 1<<20)
	after := scrapeWith(t, mc, bpMetricsAddr)
	for k, v := range after {
		if (strings.HasPrefix(k, "eztunnel_bypass_fallbacks_total") || k == "eztunnel_bypass_packets_total") && v != before[k] {
			t.Errorf("standing by, %s moved %v -> %v: a packet paid for the bypass", k, before[k], v)
		}
	}

	// A rule that uses conntrack: it runs, and the bypass attaches.
	if err := func() error {
		ns, err := netns.GetFromName(n.NetNS)
		if err != nil {
			return err
		}
		defer ns.Close()
		c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
		if err != nil {
			return err
		}
		tb := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "ezstandby"})
		ch := c.AddChain(&nftables.Chain{Name: "fwd", Table: tb, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{ // ct state established,related accept
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
			&expr.Verdict{Kind: expr.VerdictAccept},
		}})
		return c.Flush()
	}(); err != nil {
		t.Fatalf("nftables in %s: %v", n.Name, err)
	}
	nodeTalksTo(t, a1)
	nodeTalksTo(t, a2)
	waitMetrics(t, mc, "attached once conntrack runs", func(m map[string]float64) bool {
		v, _ := standby(m)
		return v == 0 && m["eztunnel_bypass_devices"] == 2 && m["eztunnel_bypass_endpoints"] == 4
	})
	if why := partStandby(); why != "" {
		t.Errorf("status: bypass standby %q after conntrack runs", why)
	}
	before = scrapeWith(t, mc, bpMetricsAddr)
	transfer(t, a1, sinkServer(t, a2, false), 1<<20)
	if d := scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"] - before["eztunnel_bypass_packets_total"]; d == 0 {
		t.Error("a1 -> a2 not bypassed once conntrack runs")
	}
	ag.stop(t)
}
