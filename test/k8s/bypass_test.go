//go:build k8s

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/k8scluster"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// bpnPin is the pinned datapath of TestBypassPodNeighbours's host-run agent.
const bpnPin = "/sys/fs/bpf/eztunnel-bpntest"

const beLiberal = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"

// bridgeNeighbours lists the IPv4 neighbour entries on the cluster's CNI
// bridge: address -> (state, managed).
func bridgeNeighbours(t testing.TB) map[netip.Addr]netlink.Neigh {
	t.Helper()
	br, err := netlink.LinkByName(k8scluster.BridgeLink)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netlink.NeighList(br.Attrs().Index, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]netlink.Neigh{}
	for _, n := range ns {
		if ip, ok := netip.AddrFromSlice(n.IP); ok && n.LinkIndex == br.Attrs().Index {
			out[ip.Unmap()] = n
		}
	}
	return out
}

const usableNUD = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT

func managed(n netlink.Neigh) bool { return n.FlagsExt&netlink.NTF_EXT_MANAGED != 0 }

// TestBypassPodNeighbours (issue #12): two pods without probes, which the
// node never talks to, exchange TCP streams and UDP datagrams. Without the
// agent the node has no neighbour entry for them (so the bypass would have
// no endpoint). A Kubernetes-mode agent on the host (--bypass=true, with
// nf_conntrack_tcp_be_liberal=1 set by the test) takes their addresses from
// the API and keeps managed neighbour entries for them on the bridge; the
// same traffic is then bypassed (its counters grow, no_endpoint does not),
// byte-exact as on the kernel path. Deleting a pod deletes its entry;
// SIGTERM leaves the entries (as it leaves the bypass pinned), `eztunnel
// uninstall` removes them all.
func TestBypassPodNeighbours(tt *testing.T) {
	t := summarized(tt)
	const ns = "ez-bpn"
	old, err := os.ReadFile(beLiberal)
	if err != nil {
		t.Fatalf("the bypass needs conntrack: %v", err)
	}
	if err := os.WriteFile(beLiberal, []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(beLiberal, old, 0o644); err != nil {
			t.Errorf("restore %s: %v", beLiberal, err)
		}
	})
	applyNamespace(t, ns, nil, streamUDPPod("server", ns)+streamUDPPod("client", ns), "server", "client")
	ip := map[string]netip.Addr{}
	for _, p := range []string{"server", "client"} {
		a, err := netip.ParseAddr(podIP(t, ns, p))
		if err != nil {
			t.Fatalf("%s: pod IP: %v", p, err)
		}
		ip[p] = a
	}
	a := &app{ns: ns}
	streamAddr := net.JoinHostPort(ip["server"].String(), "7000")
	udpAddr := net.JoinHostPort(ip["server"].String(), "7001")
	const datagrams = 300
	traffic := func(what string) {
		t.Helper()
		a.stream(t, streamAddr, 2, 1<<20) // byte-exact both ways, or it fails
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := cl.Kubectl(ctx, "-n", ns, "exec", "client", "-c", "w", "--", "/eztunnel-lab", "workload", "udp",
			"--addr", udpAddr, "--n", fmt.Sprint(datagrams), "--size", "200")
		var res workload.UDPResult
		if jerr := json.Unmarshal(out, &res); err != nil || jerr != nil {
			t.Fatalf("%s: udp: %v %v: %s", what, err, jerr, out)
		}
		if res.Echoed != datagrams {
			t.Fatalf("%s: udp: %d of %d datagrams echoed whole", what, res.Echoed, datagrams)
		}
	}
	noUsable := func(when string) {
		t.Helper()
		nb := bridgeNeighbours(t)
		for p, a := range ip {
			if n, ok := nb[a]; ok && n.State&usableNUD != 0 {
				t.Fatalf("%s: the node has a usable neighbour entry for pod %s (%s): state %#x; the test needs pods the node never talked to", when, p, a, n.State)
			}
		}
	}

	// An entry left for a reused address (an earlier test's pod the host
	// talked to) is flushed: these pods are ones the node never talked to.
	if br, err := netlink.LinkByName(k8scluster.BridgeLink); err != nil {
		t.Fatal(err)
	} else {
		for _, a := range ip {
			netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: unix.AF_INET, IP: a.AsSlice()})
		}
	}
	// The kernel path: pod to pod over the bridge, no neighbour entry made.
	noUsable("before any traffic")
	traffic("kernel path")
	noUsable("after the kernel path's traffic")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	uninstall := func() error {
		uctx, ucancel := context.WithTimeout(context.Background(), time.Minute)
		defer ucancel()
		out, err := sysexec.Command(uctx, filepath.Join(workDir, "eztunnel"), "uninstall", "--pin-path", bpnPin, "--drain-timeout", "1s").CombinedOutput()
		if err != nil {
			return fmt.Errorf("uninstall: %v\n%s", err, out)
		}
		return nil
	}
	// start runs an agent on the host (the bypass required) with args,
	// and waits until it is ready; the test's end kills it if it runs and
	// uninstalls.
	var metricsAddr string
	start := func(name string, args ...string) (stop func()) {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		metricsAddr = ln.Addr().String()
		ln.Close()
		ready := filepath.Join(t.TempDir(), "ready")
		logs := &logbuf.Buffer{}
		cmd := sysexec.Command(ctx, filepath.Join(workDir, "eztunnel"), append([]string{"run", "--pin-path", bpnPin, "--bypass=true",
			"--adopt=false", "--metrics-addr", metricsAddr, "--ready-file", ready}, args...)...)
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		stopped := false
		t.Cleanup(func() {
			if !stopped {
				cmd.Process.Kill()
				cmd.Wait()
			}
			if t.Failed() {
				t.Logf("%s agent log:\n%s", name, logs.String())
			}
		})
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			if _, err := os.Stat(ready); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s agent not ready after a minute:\n%s", name, logs.String())
			}
		}
		return func() {
			t.Helper()
			cmd.Process.Signal(syscall.SIGTERM)
			stopped = true
			if err := cmd.Wait(); err != nil {
				t.Errorf("%s agent exit: %v", name, err)
			}
		}
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			if err := uninstall(); err != nil {
				t.Error(err)
			}
		}
	})
	metricsNow := func() map[string]float64 { return metricsAt(t, metricsAddr) }
	const noEndpoint = `eztunnel_bypass_fallbacks_total{reason="no_endpoint"}`

	// Before: a plain-mode agent (no API) knows no address of these pods
	// (no neighbour entry on the bridge): nothing could be delivered to
	// their veths, so the bypass attaches to none of them and says why,
	// and their traffic pays for no bypass lookup (it fell back as
	// no_endpoint while the bypass attached regardless).
	stopPlain := start("plain-mode", "--cgroup", podsCgroup())
	idle := func(m map[string]float64) int {
		n := 0
		for k, v := range m {
			if strings.HasPrefix(k, `eztunnel_bypass_idle_device{`) && strings.Contains(k, `reason="no_endpoint"`) && v == 1 {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(30 * time.Second); idle(metricsNow()) < 2; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("plain-mode agent: pod veths reported idle %d, want both pods' (no address learnt): %v", idle(metricsNow()), metricsNow())
		}
	}
	p0 := metricsNow()
	traffic("plain-mode agent")
	p1 := metricsNow()
	t.Logf("plain-mode agent: idle veths %d, bypassed packets %v, no_endpoint fallbacks %v", idle(p1), p1["eztunnel_bypass_packets_total"]-p0["eztunnel_bypass_packets_total"], p1[noEndpoint]-p0[noEndpoint])
	if d := p1[noEndpoint] - p0[noEndpoint] + p1["eztunnel_bypass_packets_total"] - p0["eztunnel_bypass_packets_total"]; d != 0 {
		t.Errorf("plain-mode agent: %v packets met the bypass (devices %v) on veths it could deliver nothing to", d, p1["eztunnel_bypass_devices"])
	}
	if _, ok := p1["eztunnel_bypass_managed_neighbours"]; ok {
		t.Errorf("a plain-mode agent exports eztunnel_bypass_managed_neighbours")
	}
	stopPlain()
	if err := uninstall(); err != nil {
		t.Fatal(err)
	}
	noUsable("after the plain-mode agent")

	// The agent: Kubernetes mode.
	stop := start("kubernetes-mode", "--kubernetes", "--kubeconfig", cl.Kubeconfig, "--node-name", k8scluster.NodeName)
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached in 30 s; bridge neighbours %v; metrics managed %v endpoints %v", what,
					bridgeNeighbours(t), metricsNow()["eztunnel_bypass_managed_neighbours"], metricsNow()["eztunnel_bypass_endpoints"])
			}
		}
	}
	resolved := func(addrs ...netip.Addr) func() bool {
		return func() bool {
			nb := bridgeNeighbours(t)
			for _, a := range addrs {
				if n, ok := nb[a]; !ok || !managed(n) || n.State&usableNUD == 0 {
					return false
				}
			}
			return true
		}
	}
	waitFor("managed, resolved neighbour entries for both pods", resolved(ip["server"], ip["client"]))
	waitFor("both pods bypass endpoints", func() bool {
		m := metricsNow()
		return m["eztunnel_bypass_managed_neighbours"] >= 2 && m["eztunnel_bypass_endpoints"] >= 2
	})

	// The same traffic, bypassed.
	m0 := metricsNow()
	traffic("bypass")
	m1 := metricsNow()
	bypassed := m1["eztunnel_bypass_packets_total"] - m0["eztunnel_bypass_packets_total"]
	t.Logf("kubernetes-mode agent: bypassed packets %v, no_endpoint fallbacks %v",
		bypassed, m1[noEndpoint]-m0[noEndpoint])
	if bypassed < datagrams {
		t.Errorf("%v packets bypassed during %d UDP round trips and two 1 MiB streams each way", bypassed, datagrams)
	}
	if d := m1[noEndpoint] - m0[noEndpoint]; d != 0 {
		t.Errorf("%v no_endpoint fallbacks during the pods' traffic", d)
	}

	// A pod deleted: its entry goes, the other's stays.
	kubectl(t, "-n", ns, "delete", "pod", "server", "--wait=true", "--timeout=60s")
	waitFor("the deleted pod's managed entry removed", func() bool {
		n, ok := bridgeNeighbours(t)[ip["server"]]
		return !ok || !managed(n)
	})
	if !resolved(ip["client"])() {
		t.Fatalf("the remaining pod's managed entry went too: %v", bridgeNeighbours(t))
	}
	waitFor("the metric counts one entry less", func() bool {
		return metricsNow()["eztunnel_bypass_managed_neighbours"] == m1["eztunnel_bypass_managed_neighbours"]-1
	})

	// SIGTERM: the bypass stays pinned, so do the entries (a restart keeps
	// the pods bypassed); uninstall removes them all.
	stop()
	if !resolved(ip["client"])() {
		t.Errorf("SIGTERM removed the client pod's managed entry: %v", bridgeNeighbours(t))
	}

	// Restart: a managed entry on the bridge for an address no pod has
	// (one a stopped agent left for a pod deleted meanwhile) is deleted
	// once the new agent has the pods; the client's stays.
	gone := netip.MustParseAddr("10.244.0.250")
	if _, ok := bridgeNeighbours(t)[gone]; ok {
		t.Fatalf("%s has a neighbour entry on the bridge already", gone)
	}
	br, err := netlink.LinkByName(k8scluster.BridgeLink)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: unix.AF_INET, IP: gone.AsSlice(),
		State: netlink.NUD_NONE, FlagsExt: netlink.NTF_EXT_MANAGED}); err != nil {
		t.Fatal(err)
	}
	if n, ok := bridgeNeighbours(t)[gone]; !ok || !managed(n) {
		t.Fatalf("the test's managed entry for %s: %+v", gone, n)
	}
	stop = start("restarted kubernetes-mode", "--kubernetes", "--kubeconfig", cl.Kubeconfig, "--node-name", k8scluster.NodeName)
	waitFor("the stale managed entry deleted by the restarted agent", func() bool {
		n, ok := bridgeNeighbours(t)[gone]
		return !ok || !managed(n)
	})
	if !resolved(ip["client"])() {
		t.Errorf("the restarted agent removed the client pod's managed entry: %v", bridgeNeighbours(t))
	}
	stop()
	uninstalled = true
	if err := uninstall(); err != nil {
		t.Fatal(err)
	}
	noManaged := func(when string) {
		t.Helper()
		for a, n := range bridgeNeighbours(t) {
			if managed(n) {
				t.Errorf("managed neighbour entry %s left %s", a, when)
			}
		}
	}
	noManaged("after uninstall")

	// An agent started with the bypass off removes managed entries an
	// earlier one left, as it unpins the bypass.
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: unix.AF_INET, IP: ip["client"].AsSlice(),
		State: netlink.NUD_NONE, FlagsExt: netlink.NTF_EXT_MANAGED}); err != nil {
		t.Fatal(err)
	}
	uninstalled = false
	stop = start("kubernetes-mode --bypass=false", "--kubernetes", "--kubeconfig", cl.Kubeconfig, "--node-name", k8scluster.NodeName, "--bypass=false")
	noManaged("by an agent with --bypass=false")
	stop()
	uninstalled = true
	if err := uninstall(); err != nil {
		t.Fatal(err)
	}
}
