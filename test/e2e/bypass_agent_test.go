package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/podnet"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// `eztunnel run --bypass` in a node namespace of the multi-node lab: the
// agent discovers the node's pod veths and addresses from netlink, keeps
// converging while pods come and go, exports the bypass counters in its
// metrics and detaches everything when it stops.

// bpMetricsAddr is the agent's metrics address inside the node namespace
// (a fresh namespace: nothing else listens there).
const bpMetricsAddr = "127.0.0.1:9464"

// nodeClient is an HTTP client whose connections are opened in n's netns.
func nodeClient(n *multinode.Node) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = n.Do(func() (err error) {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
}

// nodeTalksTo sends one UDP datagram from the node to each address of p
// (as kubelet probes do): the node resolves them (neighbour entries on the
// bridge) and the bridge learns p's MAC from the replies (FDB). (A datagram
// from the pod to its gateway does not do: the node's ICMP answer, which
// makes it resolve the pod, is rate-limited.)
func nodeTalksTo(t *testing.T, p *multinode.Pod) {
	t.Helper()
	for _, ip := range []netip.Addr{p.IPv4, p.IPv6} {
		if err := p.Node.Do(func() error {
			c, err := net.Dial("udp", netip.AddrPortFrom(ip, 9).String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("hello"))
			return err
		}); err != nil {
			t.Fatalf("%s -> %s: %v", p.Node.Name, ip, err)
		}
	}
	// Wait until both are resolved.
	h, err := p.Node.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br, err := h.LinkByName(p.Node.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(scaled(10 * time.Second)); ; time.Sleep(20 * time.Millisecond) {
		found := 0
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			ns, err := h.NeighList(br.Attrs().Index, fam)
			if err != nil {
				t.Fatal(err)
			}
			for _, nb := range ns {
				if ip, _ := netip.AddrFromSlice(nb.IP); (ip.Unmap() == p.IPv4 || ip == p.IPv6) && len(nb.HardwareAddr) == 6 {
					found++
				}
			}
		}
		if found == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s has not resolved both addresses of %s", p.Node.Name, p.Name)
		}
	}
}

// bypassTCX lists, per device of n (every link in its netns), the
// bypass's programs (name#id) at tcx ingress and egress.
func bypassTCX(t *testing.T, n *multinode.Node) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range tcxChains(t, n.NetNS, n.Handle) {
		if strings.HasPrefix(p.Name, "ez_bypass") {
			out[p.Dev] = append(out[p.Dev], fmt.Sprintf("%s#%d", p.Name, p.ID))
		}
	}
	return out
}

// waitMetrics scrapes until ok accepts the sample (bounded: discovery
// follows netlink updates, with a 5 s resync as backstop).
func waitMetrics(t *testing.T, c *http.Client, what string, ok func(map[string]float64) bool) map[string]float64 {
	t.Helper()
	var m map[string]float64
	for deadline := time.Now().Add(scaled(20 * time.Second)); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if m = scrapeWith(t, c, bpMetricsAddr); ok(m) {
			return m
		}
	}
	t.Fatalf("%s: never happened; last scrape: devices %v endpoints %v", what, m["eztunnel_bypass_devices"], m["eztunnel_bypass_endpoints"])
	return nil
}

func TestBypassAgent(t *testing.T) {
	l := newMultinode(t, multinode.Options{Name: "mnba", Nodes: 1})
	n := l.Node(1)
	a1, a2 := mnPod(t, n, "a1"), mnPod(t, n, "a2")
	pin := "/sys/fs/bpf/eztunnel-e2e-mnba"
	uninstall := func() {
		var out bytes.Buffer
		cmd := n.Cmd(context.Background(), bin, "uninstall", "--pin-path", pin, "--drain-timeout", "5s")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n.Run(cmd); err != nil {
			t.Errorf("uninstall: %v: %s", err, out.String())
		}
	}
	t.Cleanup(func() {
		if _, err := os.Stat(pin); err == nil {
			uninstall()
		}
	})
	failArgs := []string{"run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
		"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false"}

	t.Run("needs-be-liberal", func(t *testing.T) {
		setBeLiberal(t, n, "0")
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := n.Cmd(ctx, bin, failArgs...)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n.Run(cmd); err == nil || !strings.Contains(out.String(), "nf_conntrack_tcp_be_liberal") {
			t.Fatalf("run --bypass with be_liberal 0: %v, output %q; want a failure naming the sysctl", err, out.String())
		}
		if on := bypassTCX(t, n); len(on) > 0 {
			t.Errorf("bypass programs attached after the failure: %v", on)
		}
		if _, err := os.Stat(pin); !os.IsNotExist(err) {
			t.Errorf("pin path %s after the failure: %v", pin, err)
		}
	})
	t.Run("default-without-be-liberal", func(t *testing.T) {
		// Not asked for (the default): the agent runs without the bypass
		// and says why, in its log and its metrics.
		var def []string
		for _, a := range failArgs {
			if a != "--bypass" {
				def = append(def, a)
			}
		}
		a := startNodeAgent(t, t, n, append(def, "--metrics-addr", bpMetricsAddr)...)
		m := scrapeWith(t, nodeClient(n), bpMetricsAddr)
		found := false
		for k, v := range m {
			if strings.HasPrefix(k, "eztunnel_bypass_enabled{") {
				found = true
				if v != 0 || k != `eztunnel_bypass_enabled{reason="node_unsuitable"}` {
					t.Errorf("%s %v, want 0 with the reason node_unsuitable", k, v)
				}
			}
		}
		if !found {
			t.Errorf("no eztunnel_bypass_enabled exported")
		}
		if on := bypassTCX(t, n); len(on) > 0 {
			t.Errorf("bypass programs attached by default on a node without be_liberal: %v", on)
		}
		a.stop(t)
		if !strings.Contains(a.logs.String(), "running without the bridge bypass") {
			t.Errorf("no warning in the log:\n%s", a.logs.String())
		}
		uninstall()
	})
	setBeLiberal(t, n, "1")

	nodeTalksTo(t, a1)
	nodeTalksTo(t, a2)
	t.Run("discovery-rule", func(t *testing.T) { checkDiscovery(t, n, a1, a2) })
	lock := filepath.Join(t.TempDir(), "agent.lock")
	args := func() []string {
		return []string{"run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
			"--lock-file", lock, "--adopt=false", "--metrics-addr", bpMetricsAddr}
	}
	ag := startNodeAgent(t, t, n, args()...)
	mc := nodeClient(n)

	t.Run("same-node", func(t *testing.T) {
		waitMetrics(t, mc, "a1 and a2 discovered", func(m map[string]float64) bool {
			return m["eztunnel_bypass_devices"] == 2 && m["eztunnel_bypass_endpoints"] == 4
		})
		for _, v6 := range []bool{false, true} {
			before := scrapeWith(t, mc, bpMetricsAddr)
			tx := txBytes(t, n, a2.HostVeth)
			transfer(t, a1, sinkServer(t, a2, v6), mnTransfer)
			after := scrapeWith(t, mc, bpMetricsAddr)
			pk := after["eztunnel_bypass_packets_total"] - before["eztunnel_bypass_packets_total"]
			by := after["eztunnel_bypass_bytes_total"] - before["eztunnel_bypass_bytes_total"]
			viaBridge := txBytes(t, n, a2.HostVeth) - tx
			t.Logf("%s: bypassed %v packets, %v bytes; bridge to a2: %d bytes", family(v6), pk, by, viaBridge)
			if pk == 0 || by < mnTransfer/2 || viaBridge >= mnTransfer/2 {
				t.Errorf("%s a1 -> a2: bypassed %v packets, %v bytes; the bridge forwarded %d bytes of %d", family(v6), pk, by, viaBridge, mnTransfer)
			}
			if after["eztunnel_bypass_fallbacks_total{reason=\"tcp_control\"}"] == 0 {
				t.Errorf("no tcp_control fallback exported: %v", after)
			}
		}
	})

	t.Run("pod-added-and-removed", func(t *testing.T) {
		a3 := mnPod(t, n, "a3")
		// Until the node learns a3's address, nothing could be delivered
		// to its veth: the bypass leaves it unattached and says why.
		idle := func(m map[string]float64) float64 {
			for k, v := range m {
				if strings.HasPrefix(k, `eztunnel_bypass_idle_device{device="`+a3.HostVeth+`",reason="no_endpoint"}`) {
					return v
				}
			}
			return 0
		}
		waitMetrics(t, mc, "a3's veth reported idle", func(m map[string]float64) bool {
			return idle(m) == 1 && m["eztunnel_bypass_devices"] == 2
		})
		if on := bypassTCX(t, n); len(on[a3.HostVeth]) != 0 {
			t.Errorf("tcx of %s, no pod address learnt: %v, want nothing attached", a3.HostVeth, on[a3.HostVeth])
		}
		// A bridge without a MAC of its own takes its ports' lowest: a
		// new port can change it, and the kernel then flushes the
		// bridge's neighbours (NETDEV_CHANGEADDR). The node learns the
		// pods again from its next packets to them.
		for _, p := range []*multinode.Pod{a3, a1, a2} {
			nodeTalksTo(t, p)
		}
		waitMetrics(t, mc, "a3 discovered", func(m map[string]float64) bool {
			return m["eztunnel_bypass_devices"] == 3 && m["eztunnel_bypass_endpoints"] == 6 && idle(m) == 0
		})
		on := bypassTCX(t, n)
		if len(on[a3.HostVeth]) != 2 {
			t.Errorf("tcx of %s: %v, want ez_bypass and ez_bypass_admit", a3.HostVeth, on[a3.HostVeth])
		}
		before := scrapeWith(t, mc, bpMetricsAddr)
		tx := txBytes(t, n, a3.HostVeth)
		transfer(t, a1, sinkServer(t, a3, false), mnTransfer)
		after := scrapeWith(t, mc, bpMetricsAddr)
		by := after["eztunnel_bypass_bytes_total"] - before["eztunnel_bypass_bytes_total"]
		if viaBridge := txBytes(t, n, a3.HostVeth) - tx; by < mnTransfer/2 || viaBridge >= mnTransfer/2 {
			t.Errorf("a1 -> a3 (added after the agent): bypassed %v bytes, the bridge forwarded %d of %d", by, viaBridge, mnTransfer)
		}
		// The pod goes: its veth (and the pod's end) is deleted.
		h, err := n.Handle()
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		lk, err := h.LinkByName(a3.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.LinkDel(lk); err != nil {
			t.Fatal(err)
		}
		nodeTalksTo(t, a1) // the bridge's MAC may have changed again
		nodeTalksTo(t, a2)
		waitMetrics(t, mc, "a3's veth and endpoints removed", func(m map[string]float64) bool {
			return m["eztunnel_bypass_devices"] == 2 && m["eztunnel_bypass_endpoints"] == 4
		})
		// a1 -> a2 is still bypassed.
		before = scrapeWith(t, mc, bpMetricsAddr)
		transfer(t, a1, sinkServer(t, a2, false), 1<<20)
		if d := scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"] - before["eztunnel_bypass_packets_total"]; d == 0 {
			t.Error("a1 -> a2 not bypassed after a3 went")
		}
	})

	parent := t
	status := func(t *testing.T) map[string]any {
		t.Helper()
		var out bytes.Buffer
		cmd := n.Cmd(context.Background(), bin, "status", "--pin-path", pin, "-o", "json")
		cmd.Stdout = &out
		cmd.Stderr = &out
		if err := n.Run(cmd); err != nil {
			t.Fatalf("status: %v: %s", err, out.String())
		}
		var rep map[string]any
		if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
			t.Fatalf("status json: %v: %s", err, out.String())
		}
		return rep
	}
	// pinnedBypass: status shows the bypass pinned with a1 and a2.
	pinnedBypass := func(t *testing.T) {
		t.Helper()
		b, ok := status(t)["bypass"].(map[string]any)
		if !ok || b["pod_veths"] != float64(2) || b["endpoints"] != float64(4) {
			t.Errorf("status: bypass %v, want 2 pod veths and 4 endpoints pinned", b)
		}
	}
	onBoth := func(t *testing.T, what string) map[string][]string {
		t.Helper()
		on := bypassTCX(t, n)
		for _, p := range []*multinode.Pod{a1, a2} {
			if len(on[p.HostVeth]) != 2 {
				t.Fatalf("%s: tcx of %s: %v, want ez_bypass and ez_bypass_admit once each", what, p.HostVeth, on[p.HostVeth])
			}
		}
		return on
	}
	// stillBypassed: the streams' packets keep being bypassed.
	stillBypassed := func(t *testing.T, what string) {
		t.Helper()
		b0 := scrapeWith(t, mc, bpMetricsAddr)["eztunnel_bypass_packets_total"]
		waitMetrics(t, mc, what+": the streams bypassed", func(m map[string]float64) bool {
			return m["eztunnel_bypass_packets_total"] > b0+20
		})
	}
	t.Run("takeover-under-traffic", func(t *testing.T) {
		// The links are pinned: the new agent puts its programs in them in
		// place. Streams running across see every byte, in order.
		before := onBoth(t, "before")
		st := startStreams(t, a1, a2)
		next := startNodeAgent(t, parent, n, append(args(), "--takeover")...)
		after := onBoth(t, "after the takeover")
		for _, p := range []*multinode.Pod{a1, a2} {
			for _, pr := range after[p.HostVeth] {
				if slices.Contains(before[p.HostVeth], pr) {
					t.Errorf("after the takeover: %s (the old agent's program) still on %s", pr, p.HostVeth)
				}
			}
		}
		ag.stop(t) // standing by
		ag = next
		stillBypassed(t, "after the takeover")
		st.stop(t)
		if !strings.Contains(ag.logs.String(), "adopting the endpoints") {
			t.Errorf("the new agent did not adopt the pinned endpoints:\n%s", ag.logs.String())
		}
	})

	// bypassLinks: the pinned bypass links (pin -> link id) from status.
	bypassLinks := func(t *testing.T) map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		ls, _ := status(t)["links"].([]any)
		for _, l := range ls {
			m, _ := l.(map[string]any)
			if p, _ := m["pin"].(string); strings.Contains(p, "/ez_bypass") {
				out[p], _ = m["id"].(float64)
			}
		}
		return out
	}
	t.Run("restart-under-traffic", func(t *testing.T) {
		st := startStreams(t, a1, a2)
		ag.stop(t)
		// Stopped: still attached and pinned, still bypassing.
		onBoth(t, "agent stopped")
		pinnedBypass(t)
		links := bypassLinks(t)
		if len(links) != 4 {
			t.Errorf("pinned bypass links %v, want 4 (two pod veths, both ways)", links)
		}
		ag = startNodeAgent(t, parent, n, args()...)
		onBoth(t, "restarted")
		// Updated in place: the same links, never detached.
		if after := bypassLinks(t); !maps.Equal(after, links) {
			t.Errorf("pinned bypass links after the restart %v, want the same links %v", after, links)
		}
		stillBypassed(t, "after the restart")
		st.stop(t)
	})

	t.Run("sigkill-then-rerun", func(t *testing.T) {
		st := startStreams(t, a1, a2)
		ag.cmd.Process.Kill()
		<-ag.exited
		ag.exited <- nil
		onBoth(t, "agent killed")
		ag = startNodeAgent(t, parent, n, args()...)
		onBoth(t, "rerun")
		stillBypassed(t, "after the rerun")
		st.stop(t)
	})

	t.Run("turned-off-under-traffic", func(t *testing.T) {
		st := startStreams(t, a1, a2)
		ag.stop(t)
		var off []string
		for _, a := range args() {
			if a != "--bypass" {
				off = append(off, a)
			}
		}
		ag = startNodeAgent(t, parent, n, append(off, "--bypass=false")...)
		if on := bypassTCX(t, n); len(on) > 0 {
			t.Errorf("--bypass=false: bypass programs still attached: %v", on)
		}
		if b := status(t)["bypass"]; b != nil {
			t.Errorf("--bypass=false: status shows a pinned bypass: %v", b)
		}
		m := scrapeWith(t, mc, bpMetricsAddr)
		if v, ok := m[`eztunnel_bypass_enabled{reason="disabled_by_flag"}`]; !ok || v != 0 {
			t.Errorf("--bypass=false: eztunnel_bypass_enabled %v (exported %v), want 0 with the reason", v, ok)
		}
		if !strings.Contains(ag.logs.String(), "removed the bridge bypass an earlier agent pinned") {
			t.Errorf("no removal in the log:\n%s", ag.logs.String())
		}
		st.stop(t) // the streams switched to the kernel path once, intact
	})

	t.Run("uninstall-under-traffic", func(t *testing.T) {
		ag.stop(t)
		ag = startNodeAgent(t, parent, n, args()...)
		onBoth(t, "on again")
		st := startStreams(t, a1, a2)
		stillBypassed(t, "on again")
		ag.stop(t)
		uninstall()
		if on := bypassTCX(t, n); len(on) > 0 {
			t.Errorf("after uninstall: bypass programs still attached: %v", on)
		}
		if _, err := os.Stat(pin); !os.IsNotExist(err) {
			t.Errorf("after uninstall: %s: %v", pin, err)
		}
		st.stop(t)
	})
}

// streams are a TCP and a UDP echo stream, each message numbered, running
// from one pod to another until stop, which checks every echo came back
// exact and in order.
type streams struct {
	done chan struct{}
	errs chan error
	n    [2]int
}

func startStreams(t *testing.T, from, to *multinode.Pod) *streams {
	t.Helper()
	s := &streams{done: make(chan struct{}), errs: make(chan error, 2)}
	tc, tcpEcho := echoConn(t, from, to, false)
	pc := listenUDPIn(t, to, false)
	go workload.ServeUDPEcho(pc)
	uc, err := dialFrom(from, "udp", netip.MustParseAddrPort(pc.LocalAddr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	udpEcho := func(msg string) error {
		if _, err := uc.Write([]byte(msg)); err != nil {
			return err
		}
		uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2048)
		k, err := uc.Read(buf)
		if err != nil {
			return err
		}
		if string(buf[:k]) != msg {
			return fmt.Errorf("echoed %q, sent %q", buf[:k], msg)
		}
		return nil
	}
	for i, echo := range []func(string) error{
		func(msg string) error { return tcpEcho(msg, 5*time.Second) }, udpEcho,
	} {
		go func() {
			for k := 0; ; k++ {
				select {
				case <-s.done:
					s.errs <- nil
					return
				default:
				}
				msg := fmt.Sprintf("stream %d message %d %s", i, k, strings.Repeat("x", k%1000))
				if err := echo(msg); err != nil {
					s.errs <- fmt.Errorf("stream %d (tcp, udp), message %d: %w", i, k, err)
					return
				}
				s.n[i] = k + 1
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	t.Cleanup(func() { tc.Close(); uc.Close(); pc.Close() })
	return s
}

func (s *streams) stop(t *testing.T) {
	t.Helper()
	close(s.done)
	for range 2 {
		if err := <-s.errs; err != nil {
			t.Error(err)
		}
	}
	t.Logf("streams: %d TCP and %d UDP messages echoed exact", s.n[0], s.n[1])
	if s.n[0] == 0 || s.n[1] == 0 {
		t.Errorf("streams: %d TCP and %d UDP messages: nothing ran", s.n[0], s.n[1])
	}
}

// nodeAgent is `eztunnel run` in a node's namespace.
type nodeAgent struct {
	cmd    *exec.Cmd
	logs   *logbuf.Buffer
	exited chan error
}

// startNodeAgent starts `eztunnel args...` in n's netns and System cgroup
// and waits for its ready file; killed at owner's cleanup.
func startNodeAgent(t, owner *testing.T, n *multinode.Node, args ...string) *nodeAgent {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	a := &nodeAgent{logs: &logbuf.Buffer{}, exited: make(chan error, 1)}
	a.cmd = n.Cmd(context.Background(), bin, append(args, "--ready-file", ready)...)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := n.Start(a.cmd); err != nil {
		t.Fatal(err)
	}
	go func() { a.exited <- a.cmd.Wait() }()
	owner.Cleanup(func() {
		a.cmd.Process.Kill()
		err := <-a.exited
		a.exited <- err
		if owner.Failed() {
			owner.Logf("agent log:\n%s", a.logs.String())
		}
	})
	waitFile(t, ready, a.logs.String)
	return a
}

// stop sends SIGTERM and waits for a clean exit.
func (a *nodeAgent) stop(t *testing.T) {
	t.Helper()
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-a.exited:
		a.exited <- err // for the cleanup
		if err != nil {
			t.Fatalf("agent exit: %v\n%s", err, a.logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("agent did not stop after SIGTERM:\n%s", a.logs.String())
	}
}

// checkDiscovery: podnet.Scan in n finds a1 and a2's veths and exactly
// their addresses, with their eth0 MACs; a bridge neighbour whose MAC no
// port has learnt is left out.
func checkDiscovery(t *testing.T, n *multinode.Node, pods ...*multinode.Pod) {
	h, err := n.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br, err := h.LinkByName(n.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	stray := netip.MustParseAddr("10.255.0.9")
	nb := &netlink.Neigh{LinkIndex: br.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: stray.AsSlice(), HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 9}}
	if err := h.NeighAdd(nb); err != nil {
		t.Fatal(err)
	}
	defer h.NeighDel(nb)
	st, err := podnet.Scan(h)
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]podnet.Endpoint{}
	for _, p := range pods {
		veth, err := h.LinkByName(p.HostVeth)
		if err != nil {
			t.Fatal(err)
		}
		port, ok := st.Ports[veth.Attrs().Index]
		if !ok || port.Bridge != br.Attrs().Index || !bytes.Equal(port.BridgeMAC, br.Attrs().HardwareAddr) {
			t.Errorf("%s: port %+v (found %v), want on bridge %s", p.HostVeth, port, ok, n.Bridge)
		}
		ph, err := p.Handle()
		if err != nil {
			t.Fatal(err)
		}
		eth, err := ph.LinkByName("eth0")
		ph.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range []netip.Addr{p.IPv4, p.IPv6} {
			want[ip] = podnet.Endpoint{Port: veth.Attrs().Index, MAC: eth.Attrs().HardwareAddr}
		}
	}
	if len(st.Ports) != len(pods) {
		t.Errorf("ports %v, want the %d pod veths only", st.Ports, len(pods))
	}
	if len(st.Endpoints) != len(want) {
		t.Errorf("endpoints %v, want %v", st.Endpoints, want)
	}
	for ip, w := range want {
		if got, ok := st.Endpoints[ip]; !ok || got.Port != w.Port || !bytes.Equal(got.MAC, w.MAC) {
			t.Errorf("endpoint %s: %+v (found %v), want %+v", ip, got, ok, w)
		}
	}
	if _, ok := st.Endpoints[stray]; ok {
		t.Errorf("%s (neighbour with a MAC no port learnt) is an endpoint", stray)
	}
}

// TestBypassAgentCrossNode: one `eztunnel run --bypass` per node, each in
// its node's namespace (the DaemonSet model). Each discovers its pod veths
// and its uplink (from the routes to the other node's pod CIDRs), and
// cross-node TCP is bypassed out of one node and into the other. A route
// withdrawn and restored detaches and reattaches the uplink. host-gw and
// VXLAN (where the uplink is the VXLAN device).
func TestBypassAgentCrossNode(t *testing.T) {
	for _, mode := range []multinode.Mode{multinode.HostGW, multinode.VXLAN} {
		t.Run(string(mode), func(t *testing.T) { testBypassAgentCrossNode(t, mode) })
	}
}

func testBypassAgentCrossNode(t *testing.T, mode multinode.Mode) {
	name := "mnbx"
	if mode == multinode.VXLAN {
		name = "mnbv"
	}
	l := newMultinode(t, multinode.Options{Name: name, Nodes: 2, Mode: mode})
	n1, n2 := l.Node(1), l.Node(2)
	uplink := func(n *multinode.Node) string {
		if mode == multinode.VXLAN {
			return n.VXLAN
		}
		return n.Uplink
	}
	a1, b1 := mnPod(t, n1, "a1"), mnPod(t, n2, "b1")
	agents := map[*multinode.Node]*nodeAgent{}
	clients := map[*multinode.Node]*http.Client{}
	for _, n := range []*multinode.Node{n1, n2} {
		setBeLiberal(t, n, "1")
		pin := "/sys/fs/bpf/eztunnel-e2e-" + name + "-" + n.Name
		uninstallOnCleanup(t, n, pin)
		agents[n] = startNodeAgent(t, t, n, "run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
			"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false", "--metrics-addr", bpMetricsAddr)
		clients[n] = nodeClient(n)
	}
	nodeTalksTo(t, a1)
	nodeTalksTo(t, b1)
	// A pod veth and the uplink per node.
	for _, n := range []*multinode.Node{n1, n2} {
		waitMetrics(t, clients[n], n.Name+" discovered", func(m map[string]float64) bool {
			return m["eztunnel_bypass_devices"] == 2 && m["eztunnel_bypass_endpoints"] == 2
		})
		on := bypassTCX(t, n)
		if len(on[uplink(n)]) != 2 || !strings.HasPrefix(on[uplink(n)][0], "ez_bypass_in#") {
			t.Errorf("%s: tcx of the uplink %s: %v, want ez_bypass_in and ez_bypass_admit", n.Name, uplink(n), on[uplink(n)])
		}
	}
	crossNode := func(t *testing.T) (out, in float64) {
		t.Helper()
		b1m, b2m := scrapeWith(t, clients[n1], bpMetricsAddr), scrapeWith(t, clients[n2], bpMetricsAddr)
		transfer(t, a1, sinkServer(t, b1, false), mnTransfer)
		out = scrapeWith(t, clients[n1], bpMetricsAddr)["eztunnel_bypass_out_bytes_total"] - b1m["eztunnel_bypass_out_bytes_total"]
		in = scrapeWith(t, clients[n2], bpMetricsAddr)["eztunnel_bypass_in_bytes_total"] - b2m["eztunnel_bypass_in_bytes_total"]
		return out, in
	}
	t.Run("cross-node", func(t *testing.T) {
		if out, in := crossNode(t); out < mnTransfer/2 || in < mnTransfer/2 {
			t.Errorf("a1 -> b1: bypassed out of n1 %v, into n2 %v bytes of %d", out, in, mnTransfer)
		}
	})
	t.Run("route-withdrawn", func(t *testing.T) {
		h, err := n1.Handle()
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		up, err := h.LinkByName(uplink(n1))
		if err != nil {
			t.Fatal(err)
		}
		var rs []netlink.Route
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			r, err := h.RouteListFiltered(fam, &netlink.Route{LinkIndex: up.Attrs().Index}, netlink.RT_FILTER_OIF)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range r {
				if x.Gw != nil {
					rs = append(rs, x)
				}
			}
		}
		if len(rs) != 2 {
			t.Fatalf("routes via %s: %v, want n2's two pod CIDRs", uplink(n1), rs)
		}
		for _, r := range rs {
			if err := h.RouteDel(&r); err != nil {
				t.Fatal(err)
			}
		}
		waitMetrics(t, clients[n1], "n1's uplink detached", func(m map[string]float64) bool { return m["eztunnel_bypass_devices"] == 1 })
		if on := bypassTCX(t, n1); len(on[uplink(n1)]) != 0 {
			t.Errorf("routes gone: tcx of %s: %v", uplink(n1), on[uplink(n1)])
		}
		for _, r := range rs {
			if err := h.RouteAdd(&r); err != nil {
				t.Fatal(err)
			}
		}
		waitMetrics(t, clients[n1], "n1's uplink attached again", func(m map[string]float64) bool { return m["eztunnel_bypass_devices"] == 2 })
		if out, in := crossNode(t); out < mnTransfer/2 || in < mnTransfer/2 {
			t.Errorf("routes back: bypassed out of n1 %v, into n2 %v bytes of %d", out, in, mnTransfer)
		}
	})
	t.Run("bridge-mac-changed", func(t *testing.T) {
		// Routed frames to other nodes are recognised by the bridge's MAC:
		// the agent must follow a change (a bridge without a MAC of its
		// own takes its ports' lowest, so a new pod can change it).
		h, err := n1.Handle()
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		br, err := h.LinkByName(n1.Bridge)
		if err != nil {
			t.Fatal(err)
		}
		mac := net.HardwareAddr{0x02, 0x65, 0x7a, 0xbb, 0, 1}
		if err := h.LinkSetHardwareAddr(br, mac); err != nil {
			t.Fatal(err)
		}
		// a1 forgets the gateway's old MAC; the node (whose neighbours on
		// the bridge the change flushed) learns a1 again.
		ph, err := a1.Handle()
		if err != nil {
			t.Fatal(err)
		}
		defer ph.Close()
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			ns, err := ph.NeighList(0, fam)
			if err != nil {
				t.Fatal(err)
			}
			for _, nb := range ns {
				ph.NeighDel(&nb)
			}
		}
		nodeTalksTo(t, a1)
		// The agent converges after the link update (100 ms) or at its
		// resync (5 s); nothing it exports names the bridge's MAC.
		for deadline := time.Now().Add(scaled(15 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
			before := scrapeWith(t, clients[n1], bpMetricsAddr)["eztunnel_bypass_out_packets_total"]
			transfer(t, a1, sinkServer(t, b1, false), 64<<10)
			if scrapeWith(t, clients[n1], bpMetricsAddr)["eztunnel_bypass_out_packets_total"] > before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("bridge MAC changed: a1 -> b1 never bypassed again")
			}
		}
		if out, in := crossNode(t); out < mnTransfer/2 || in < mnTransfer/2 {
			t.Errorf("bridge MAC changed: bypassed out of n1 %v, into n2 %v bytes of %d", out, in, mnTransfer)
		}
	})
	t.Run("ipsec-policy", func(t *testing.T) {
		// With any xfrm policy in the node the bypass stays same-node:
		// it would skip the policy checks and the encryption.
		ns, err := netns.GetFromName(n1.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns) // route, xfrm and netfilter
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		pol := &netlink.XfrmPolicy{
			Src: &net.IPNet{IP: net.IPv4(192, 0, 2, 0), Mask: net.CIDRMask(24, 32)},
			Dst: &net.IPNet{IP: net.IPv4(198, 51, 100, 0), Mask: net.CIDRMask(24, 32)},
			Dir: netlink.XFRM_DIR_OUT,
		}
		if err := h.XfrmPolicyAdd(pol); err != nil {
			t.Fatalf("xfrm policy in %s: %v", n1.NetNS, err)
		}
		polOn := true
		defer func() {
			if polOn {
				h.XfrmPolicyDel(pol)
			}
		}()
		// No netlink event the agent follows: its resync (5 s) sees it.
		waitMetrics(t, clients[n1], "n1's uplink detached for the xfrm policy", func(m map[string]float64) bool { return m["eztunnel_bypass_devices"] == 1 })
		if out, _ := crossNode(t); out != 0 {
			t.Errorf("xfrm policy on n1: %v bytes bypassed out of n1", out)
		}
		if !strings.Contains(agents[n1].logs.String(), "xfrm (IPsec) policies") {
			t.Errorf("the agent did not log why it stopped the cross-node bypass")
		}
		if err := h.XfrmPolicyDel(pol); err != nil {
			t.Fatal(err)
		}
		polOn = false
		waitMetrics(t, clients[n1], "n1's uplink attached again", func(m map[string]float64) bool { return m["eztunnel_bypass_devices"] == 2 })
		if out, in := crossNode(t); out < mnTransfer/2 || in < mnTransfer/2 {
			t.Errorf("xfrm policy gone: bypassed out of n1 %v, into n2 %v bytes of %d", out, in, mnTransfer)
		}
	})
	t.Run("stop-then-uninstall", func(t *testing.T) {
		// Stopped agents leave the bypass pinned and working (between
		// nodes too); uninstall detaches it.
		st := startStreams(t, a1, b1)
		for _, n := range []*multinode.Node{n1, n2} {
			agents[n].stop(t)
			if on := bypassTCX(t, n); len(on[uplink(n)]) != 2 {
				t.Errorf("%s after SIGTERM: tcx of %s: %v, want the bypass still attached", n.Name, uplink(n), on[uplink(n)])
			}
		}
		transfer(t, a1, sinkServer(t, b1, true), 1<<20)
		for _, n := range []*multinode.Node{n1, n2} {
			pin := "/sys/fs/bpf/eztunnel-e2e-" + name + "-" + n.Name
			var out bytes.Buffer
			cmd := n.Cmd(context.Background(), bin, "uninstall", "--pin-path", pin, "--drain-timeout", "5s")
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := n.Run(cmd); err != nil {
				t.Errorf("uninstall on %s: %v: %s", n.Name, err, out.String())
			}
			if on := bypassTCX(t, n); len(on) > 0 {
				t.Errorf("%s after uninstall: bypass programs still attached: %v", n.Name, on)
			}
		}
		transfer(t, a1, sinkServer(t, b1, true), 1<<20)
		st.stop(t)
	})
}

// uninstallOnCleanup uninstalls the datapath pinned at pin in n when the
// test ends, if it is still there.
func uninstallOnCleanup(t *testing.T, n *multinode.Node, pin string) {
	t.Cleanup(func() {
		if _, err := os.Stat(pin); err != nil {
			return
		}
		var out bytes.Buffer
		cmd := n.Cmd(context.Background(), bin, "uninstall", "--pin-path", pin, "--drain-timeout", "5s")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n.Run(cmd); err != nil {
			t.Errorf("uninstall on %s: %v: %s", n.Name, err, out.String())
		}
	})
}
