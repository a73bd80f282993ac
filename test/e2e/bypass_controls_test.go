package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/lab/multinode"
)

// TestBypassTrafficControls runs `eztunnel run --bypass` on a node whose
// pod veths get traffic controls of another owner while it runs:
//
//   - shaped-pod: a2's host-side veth gets the tbf the bandwidth CNI
//     plugin installs for kubernetes.io/ingress-bandwidth (10 Mbit/s):
//     the agent detaches from it and reports it idle (reason qdisc) in its
//     log, `eztunnel status` and eztunnel_bypass_idle_device /
//     eztunnel_bypass_idle_devices; a TCP stream a1 -> a2 then stays at
//     most 5% above 10 Mbit/s (on the wire), as over the bridge without
//     the agent;
//   - foreign-filter: a3's veth gets an ingress qdisc with a u32 filter
//     (what the plugin's egress-bandwidth redirect hangs on): idle
//     (reason tc_filter), nothing attached to it; once the qdisc is gone
//     the veth is attached again.
func TestBypassTrafficControls(t *testing.T) {
	l := newMultinode(t, multinode.Options{Name: "mntc", Nodes: 1})
	n := l.Node(1)
	// Pods outside the agent's cgroup: the socket shortcut (sk_msg between
	// selected pods' sockets) would skip the node's stack, shaper
	// included, whatever the bypass does; this test is about the bypass.
	pod := func(name string) *multinode.Pod {
		t.Helper()
		p, err := n.AddPod(name, false)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a1, a2, a3 := pod("a1"), pod("a2"), pod("a3")
	setBeLiberal(t, n, "1")
	pin := "/sys/fs/bpf/eztunnel-e2e-mntc"
	uninstallOnCleanup(t, n, pin)
	h, err := n.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	veth := func(p *multinode.Pod) netlink.Link {
		t.Helper()
		lk, err := h.LinkByName(p.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		return lk
	}

	// The bandwidth CNI plugin's ingress shaping (plugins/meta/bandwidth,
	// createTBF): tbf at the root of the host-side veth, 25 ms latency.
	const rateBits = 10_000_000
	const rate, burst = rateBits / 8, 20_000
	tbf := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: veth(a2).Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate: rate, Buffer: netlink.Xmittime(rate, burst), Limit: rate*25/1000 + burst}

	// Without the agent: the kernel path's rate through the shaper.
	if err := h.QdiscAdd(tbf); err != nil {
		t.Fatalf("tbf on %s (sch_tbf): %v", a2.HostVeth, err)
	}
	kernelRate := iperfRate(t, a1, a2)
	if err := h.QdiscDel(tbf); err != nil {
		t.Fatal(err)
	}

	for _, p := range []*multinode.Pod{a1, a2, a3} {
		nodeTalksTo(t, p)
	}
	ag := startNodeAgent(t, t, n, "run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
		"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false", "--metrics-addr", bpMetricsAddr)
	mc := nodeClient(n)
	waitMetrics(t, mc, "a1, a2 and a3 attached", func(m map[string]float64) bool {
		return m["eztunnel_bypass_devices"] == 3 && m["eztunnel_bypass_endpoints"] == 6
	})
	idle := func(m map[string]float64, p *multinode.Pod, reason string) bool {
		for k, v := range m {
			if strings.HasPrefix(k, `eztunnel_bypass_idle_device{device="`+p.HostVeth+`",reason="`+reason) && v == 1 {
				return true
			}
		}
		return false
	}
	statusIdle := func() map[string]string {
		var out bytes.Buffer
		cmd := n.Cmd(context.Background(), bin, "status", "--pin-path", pin, "-o", "json")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n.Run(cmd); err != nil {
			t.Fatalf("status: %v: %s", err, out.String())
		}
		var rep struct {
			Parts struct {
				Parts []struct {
					Part string            `json:"part"`
					Idle map[string]string `json:"idle"`
				} `json:"parts"`
			} `json:"parts"`
		}
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("status json: %v: %s", err, out.String())
		}
		for _, p := range rep.Parts.Parts {
			if p.Part == "bypass" {
				return p.Idle
			}
		}
		t.Fatalf("status: no bypass part: %s", out.String())
		return nil
	}

	t.Run("shaped-pod", func(t *testing.T) {
		if err := h.QdiscAdd(tbf); err != nil {
			t.Fatalf("tbf on %s: %v", a2.HostVeth, err)
		}
		// Not fatal: the rate below is what matters most.
		var m map[string]float64
		for deadline := time.Now().Add(scaled(20 * time.Second)); ; time.Sleep(100 * time.Millisecond) {
			m = scrapeWith(t, mc, bpMetricsAddr)
			if idle(m, a2, `qdisc"`) && m["eztunnel_bypass_devices"] == 2 && m["eztunnel_bypass_endpoints"] == 4 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("a2's shaped veth never reported idle; last scrape: devices %v endpoints %v", m["eztunnel_bypass_devices"], m["eztunnel_bypass_endpoints"])
				break
			}
		}
		if m[`eztunnel_bypass_idle_devices{reason="qdisc"}`] != 1 {
			t.Errorf(`eztunnel_bypass_idle_devices{reason="qdisc"} %v, want 1`, m[`eztunnel_bypass_idle_devices{reason="qdisc"}`])
		}
		if why := statusIdle()[a2.HostVeth]; !strings.Contains(why, "tbf") {
			t.Errorf("status: %s idle %q, want the tbf named", a2.HostVeth, why)
		}
		if on := bypassTCX(t, n); len(on[a2.HostVeth]) != 0 {
			t.Errorf("tcx of the shaped %s: %v, want nothing attached", a2.HostVeth, on[a2.HostVeth])
		}
		before := scrapeWith(t, mc, bpMetricsAddr)
		bypassRate := iperfRate(t, a1, a2)
		after := scrapeWith(t, mc, bpMetricsAddr)
		bypassed := after["eztunnel_bypass_packets_total"] - before["eztunnel_bypass_packets_total"]
		// tbf meters whole frames (qdisc_pkt_len: each GSO segment's
		// headers count): iperf3's goodput is MSS/frame of that.
		wire := func(goodput float64) float64 {
			mtu := float64(l.PodMTU)
			return goodput * (mtu + 14) / (mtu - 52)
		}
		t.Logf("a1 -> a2 shaped to %d bit/s: without the agent %.0f bit/s goodput (%.0f on the wire), with the bypass on %.0f bit/s goodput (%.0f on the wire), %v packets bypassed meanwhile",
			rateBits, kernelRate, wire(kernelRate), bypassRate, wire(bypassRate), bypassed)
		// Above the rate is the shaper skipped: the failure this test is
		// for (the unfixed agent: 8 Gbit/s). Below it is the kernel path's
		// own shortfall on a loaded machine (nothing was bypassed; runs
		// on this shared 2-vCPU VM ranged 8.8-10.0 Mbit/s with or without
		// the agent): logged, and failed only far below, which no
		// shaper's jitter explains.
		w := wire(bypassRate)
		if w > 1.05*rateBits || w < 0.5*rateBits {
			t.Errorf("with the bypass on, a2 received %.0f bit/s on the wire, want within 5%% of %d (the kernel path: %.0f)", w, rateBits, wire(kernelRate))
		} else if w < 0.95*rateBits {
			t.Logf("below 95%% of the rate, on the kernel path (the machine's load): %.0f bit/s", w)
		}
		if bypassed != 0 {
			t.Errorf("%v packets bypassed to or from the shaped pod", bypassed)
		}
		if !strings.Contains(ag.logs.String(), "tbf") {
			t.Errorf("the agent's log does not name the tbf:\n%s", ag.logs.String())
		}
		if err := h.QdiscDel(tbf); err != nil {
			t.Fatal(err)
		}
		waitMetrics(t, mc, "a2 attached again without the tbf", func(m map[string]float64) bool {
			return !idle(m, a2, "") && m["eztunnel_bypass_devices"] == 3 && m["eztunnel_bypass_endpoints"] == 6
		})
	})

	t.Run("foreign-filter", func(t *testing.T) {
		ifx := veth(a3).Attrs().Index
		ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
		if err := h.QdiscAdd(ingress); err != nil {
			t.Fatal(err)
		}
		defer h.QdiscDel(ingress)
		filter := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifx, Parent: netlink.HANDLE_MIN_INGRESS, Priority: 7, Protocol: 0x0003 /* ETH_P_ALL */},
			ClassId: netlink.MakeHandle(1, 1), Sel: &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: []netlink.TcU32Key{{}}}}
		if err := h.FilterAdd(filter); err != nil {
			t.Fatalf("u32 filter on %s: %v", a3.HostVeth, err)
		}
		m := waitMetrics(t, mc, "a3's veth with a foreign filter idle", func(m map[string]float64) bool {
			return idle(m, a3, `tc_filter"`) && m["eztunnel_bypass_devices"] == 2
		})
		if m[`eztunnel_bypass_idle_devices{reason="tc_filter"}`] != 1 {
			t.Errorf(`eztunnel_bypass_idle_devices{reason="tc_filter"} %v, want 1`, m[`eztunnel_bypass_idle_devices{reason="tc_filter"}`])
		}
		if why := statusIdle()[a3.HostVeth]; !strings.Contains(why, "u32") {
			t.Errorf("status: %s idle %q, want the u32 filter named", a3.HostVeth, why)
		}
		if on := bypassTCX(t, n); len(on[a3.HostVeth]) != 0 {
			t.Errorf("tcx of %s with a foreign filter: %v, want nothing attached", a3.HostVeth, on[a3.HostVeth])
		}
		// a1 -> a3 is not bypassed (a3 has no endpoint), and arrives.
		before := scrapeWith(t, mc, bpMetricsAddr)
		transfer(t, a1, sinkServer(t, a3, false), 1<<20)
		if d := scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"] - before["eztunnel_bypass_packets_total"]; d != 0 {
			t.Errorf("a1 -> a3 (foreign filter on its veth): %v packets bypassed, want none", d)
		}
		if err := h.QdiscDel(ingress); err != nil {
			t.Fatal(err)
		}
		waitMetrics(t, mc, "a3 attached again without the filter", func(m map[string]float64) bool {
			return !idle(m, a3, "") && m["eztunnel_bypass_devices"] == 3
		})
	})
	ag.stop(t)
}

// iperfRate runs a 4 s iperf3 TCP stream from -> to (IPv4) and returns the
// receiver's goodput in bit/s.
func iperfRate(t *testing.T, from, to *multinode.Pod) float64 {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := to.Cmd(ctx, "iperf3", "-s", "-B", to.IPv4.String(), "-p", "5211")
	var slog bytes.Buffer
	srv.Stdout, srv.Stderr = &slog, &slog
	if err := to.Start(srv); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); srv.Wait() }()
	var out bytes.Buffer
	for try := 0; ; try++ {
		out.Reset()
		cli := from.Cmd(context.Background(), "iperf3", "-c", to.IPv4.String(), "-p", "5211", "-t", "4", "-J")
		cli.Stdout = &out
		err := from.Run(cli)
		var e struct {
			Error string `json:"error"`
		}
		if jerr := json.Unmarshal(out.Bytes(), &e); err == nil && jerr == nil && e.Error == "" {
			break
		}
		if try == 20 {
			t.Fatalf("iperf3 %s -> %s: %v: %s (server: %s)", from.Name, to.Name, err, out.String(), slog.String())
		}
		time.Sleep(100 * time.Millisecond) // the server is not listening yet
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.End.SumReceived.BitsPerSecond == 0 {
		t.Fatalf("iperf3 result %v: %s", err, out.String())
	}
	return res.End.SumReceived.BitsPerSecond
}
