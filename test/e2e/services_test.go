package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// svcPy is the Service test's clients and servers.
func svcPy(args ...string) []string {
	abs, err := filepath.Abs(filepath.Join("testdata", "services", "svc.py"))
	if err != nil {
		panic(err)
	}
	return append([]string{python, abs}, args...)
}

// svcRun runs svc.py in p and decodes its JSON result into v.
func svcRun(t *testing.T, p *netlab.Pod, v any, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := svcPy(args...)
	cmd := p.Cmd(ctx, a[0], a[1:]...)
	var errb logbuf.Buffer
	cmd.Stderr = &errb
	out, err := func() ([]byte, error) {
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := p.Start(cmd); err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(stdout)
		return b, cmd.Wait()
	}()
	if err != nil {
		t.Fatalf("svc.py %v in %s: %v\n%s%s", args, p.Name, err, out, errb.String())
	}
	if err := json.Unmarshal(out, v); err != nil {
		t.Fatalf("svc.py %v: %v: %q", args, err, out)
	}
}

// writeServices replaces the agent's services file in one rename.
func writeServices(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// lbPrograms counts the load balancer's programs attached to cgroup.
func lbPrograms(t *testing.T, cgroup string) int {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect,
		ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP4Recvmsg,
		ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername,
		ebpf.AttachCGroupGetsockopt, ebpf.AttachCgroupInetSockRelease, ebpf.AttachCGroupSockOps} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %s on %s: %v", at, cgroup, err)
		}
		for _, p := range res.Programs {
			prog, err := ebpf.NewProgramFromID(p.ID)
			if err != nil {
				t.Fatal(err)
			}
			info, err := prog.Info()
			prog.Close()
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(info.Name, "ez_svc_") { // the shortcut has sock_ops and sock_release too
				n++
			}
		}
	}
	return n
}

// pinnedSvcCounter reads one of the pinned load balancer's counters
// (`eztunnel status`: no agent needed).
func pinnedSvcCounter(t *testing.T, pin, name string) uint64 {
	t.Helper()
	out, err := eztunnel(context.Background(), "status", "--pin-path", pin, "-o", "json")
	var st struct {
		Services *struct{ Counters map[string]uint64 } `json:"services"`
	}
	if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Services == nil {
		t.Fatalf("status: %v: %s", err, out)
	}
	v, ok := st.Services.Counters[name]
	if !ok {
		t.Fatalf("status: no services counter %q: %s", name, out)
	}
	return v
}

// lbHooks is how many cgroup hooks the load balancer attaches.
const lbHooks = 11

// TestServices runs `eztunnel run --services --services-file` on the lab's
// managed cgroup: a client pod reaches ClusterIP frontends whose backends
// are other pods. TCP is byte-exact and getpeername shows the ClusterIP;
// connected and unconnected UDP keep one backend per socket and see replies
// from the ClusterIP; IPv4 and IPv6. A frontend without backends fails a
// connect with the error a real iptables REJECT (kube-proxy's rule for a
// Service without endpoints) gives the same client. Backends replaced in the
// file while connections run take effect with no failed connection. Bad
// entries are skipped and counted. sessionAffinity ClientIP keeps a client on
// one backend. The load balancer is pinned: translated sockets keep their
// backend and their reverse translation across a restart, and an agent with
// --services=false removes it.
// holdRound is one result line of svc.py hold.
type holdRound struct {
	TCPPeer    string `json:"tcp_peer"`
	TCPBackend string `json:"tcp_backend"`
	TCPExact   bool   `json:"tcp_exact"`
	TCPError   string `json:"tcp_error"`
	UDPPeer    string `json:"udp_peer"`
	UDPSource  string `json:"udp_source"`
	UDPBackend string `json:"udp_backend"`
	UDPExact   bool   `json:"udp_exact"`
	UDPError   string `json:"udp_error"`
	UDPRecvErr string `json:"udp_recv_error"`
}

// startSvcPy starts svc.py args in p with its stdin and stdout piped; it is
// stopped (stdin closed, waited for) at the test's end.
func startSvcPy(t *testing.T, p *netlab.Pod, args ...string) (io.WriteCloser, *bufio.Scanner, *logbuf.Buffer) {
	t.Helper()
	a := svcPy(args...)
	cmd := p.Cmd(context.Background(), a[0], a[1:]...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errb := &logbuf.Buffer{}
	cmd.Stderr = errb
	if err := p.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	return stdin, bufio.NewScanner(stdout), errb
}

// startHold runs svc.py hold in p (a held TCP connection and connected UDP
// socket) and returns a function that asks it for a round.
func startHold(t *testing.T, p *netlab.Pod, thost, tport, uhost, uport string) func(when string) holdRound {
	t.Helper()
	stdin, sc, errb := startSvcPy(t, p, "hold", thost, tport, uhost, uport)
	return func(when string) holdRound {
		t.Helper()
		io.WriteString(stdin, "go\n")
		if !sc.Scan() {
			t.Fatalf("%s: hold ended: %v %s", when, sc.Err(), errb.String())
		}
		var r holdRound
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: %v: %q", when, err, sc.Text())
		}
		return r
	}
}

func TestServices(t *testing.T) { services(t) }

// TestServicesSockDiag is TestServices with bpf_sock_destroy refused, as on
// kernels before 6.5: a removed backend's sockets are found by the
// iterators and destroyed with sock_diag SOCK_DESTROY.
func TestServicesSockDiag(t *testing.T) {
	t.Setenv(bpfsys.TestRefuseEnv, "ez_svc_destroy_tcp")
	services(t)
}

func services(t *testing.T) {
	e := newEnv(t, "svc", 93)
	c := e.pod("c", true)
	bs := []*netlab.Pod{e.pod("b1", false), e.pod("b2", false), e.pod("b3", false)}
	near := e.pod("b4", true) // managed: the shortcut pairs connections to it
	for _, b := range append(bs, near) {
		a := svcPy("server", "8080", b.Name)
		e.startIn(b, a[0], a[1:]...)
	}
	for _, b := range append(bs, near) {
		waitListen(t, b, 8080)
	}
	pin := e.cfg.PinRoot
	t.Cleanup(func() { eztunnel(context.Background(), "uninstall", "--pin-path", pin, "--drain-timeout", "1s") })

	const (
		vip4, vip6     = "10.96.93.10", "fd96::10"
		empty4, empty6 = "10.96.93.20", "fd96::20"
		rej4, rej6     = "10.96.93.30", "fd96::30" // not Services: iptables REJECT
		near4          = "10.96.93.50"
		sticky4        = "10.96.93.60" // sessionAffinity ClientIP
	)
	be := func(p *netlab.Pod, v6 bool) string {
		if v6 {
			return fmt.Sprintf("%q", hostport(p.IPv6, 8080))
		}
		return fmt.Sprintf("%q", hostport(p.IPv4, 8080))
	}
	dns := bs[:2]
	list := func(ps []*netlab.Pod, v6 bool) string {
		var l []string
		for _, p := range ps {
			l = append(l, be(p, v6))
		}
		return strings.Join(l, ", ")
	}
	var draining []*netlab.Pod // web backends still alive but chosen no more
	proxied := ""              // the file's proxied section ("": none)
	file := func(web ...*netlab.Pod) string {
		var b4, b6 []string
		for _, p := range web {
			b4, b6 = append(b4, be(p, false)), append(b6, be(p, true))
		}
		l4, l6 := strings.Join(b4, ", "), strings.Join(b6, ", ")
		return fmt.Sprintf(`services:
- {name: web, ip: %s, port: 80, backends: [%s], draining: [%s]}
- {name: web, ip: "%s", port: 80, backends: [%s], draining: [%s]}
- {name: dns, ip: %s, port: 53, protocol: UDP, backends: [%s]}
- {name: dns, ip: "%s", port: 53, protocol: UDP, backends: [%s]}
- {name: empty, ip: %s, port: 80, backends: []}
- {name: empty, ip: "%s", port: 80, backends: []}
- {name: bad, ip: 10.96.93.40, port: 80, protocol: SCTP, backends: []}
- {name: near, ip: %s, port: 80, backends: [%s]}
- {name: sticky, ip: %s, port: 80, affinitySeconds: 3600, backends: [%s]}
%s`, vip4, l4, list(draining, false), vip6, l6, list(draining, true), vip4, list(dns, false), vip6, list(dns, true), empty4, empty6,
			near4, be(near, false), sticky4, list(bs[:2], false), proxied)
	}
	svcFile := filepath.Join(t.TempDir(), "services.yaml")
	writeServices(t, svcFile, file(bs[0], bs[1]))

	// kube-proxy's answer for a Service without endpoints, as the reference.
	nsExec(t, c.NetNS, "iptables", "-w", "-A", "OUTPUT", "-d", rej4+"/32", "-p", "tcp", "--dport", "80", "-j", "REJECT", "--reject-with", "icmp-port-unreachable")
	nsExec(t, c.NetNS, "ip6tables", "-w", "-A", "OUTPUT", "-d", rej6+"/128", "-p", "tcp", "--dport", "80", "-j", "REJECT", "--reject-with", "icmp6-port-unreachable")

	metricsAddr := freeAddr(t)
	var agent *exec.Cmd
	logs := &logbuf.Buffer{}
	startAgent := func(t *testing.T, extra ...string) {
		t.Helper()
		ready := filepath.Join(t.TempDir(), "ready")
		args := []string{"run", "--cgroup", e.lab.Managed, "--pin-path", pin, "--adopt=false",
			"--metrics-addr", metricsAddr, "--ready-file", ready}
		if len(extra) == 0 {
			args = append(args, "--services", "--services-file", svcFile)
		}
		agent = sysexec.Command(context.Background(), bin, append(args, extra...)...)
		agent.Stdout, agent.Stderr = logs, logs
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		waitFile(t, ready, logs.String)
	}
	stopAgent := func(t *testing.T) {
		t.Helper()
		if agent == nil {
			return
		}
		agent.Process.Signal(syscall.SIGTERM)
		err := agent.Wait()
		agent = nil
		if err != nil {
			t.Fatalf("agent exit: %v\n%s", err, logs.String())
		}
	}
	defer func() {
		if agent != nil {
			agent.Process.Kill()
			agent.Wait()
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()
	startAgent(t)
	if n := lbPrograms(t, e.lab.Managed); n != lbHooks {
		t.Fatalf("%d load-balancer programs on the managed cgroup, want %d", n, lbHooks)
	}
	web := []string{"b1", "b2"}

	t.Run("tcp", func(t *testing.T) {
		for _, vip := range []string{vip4, vip6} {
			for i := range 4 {
				var r struct {
					Peer, Backend string
					Exact         bool
					Bytes         int
				}
				svcRun(t, c, &r, "tcp", vip, "80", fmt.Sprint(256<<10+i))
				if want := hostport(netip.MustParseAddr(vip), 80); r.Peer != want || !r.Exact || !slices.Contains(web, r.Backend) {
					t.Errorf("TCP to %s: getpeername %s (want %s), backend %q, exact %v (%d bytes)", vip, r.Peer, want, r.Backend, r.Exact, r.Bytes)
				}
			}
		}
	})
	t.Run("udp", func(t *testing.T) {
		for _, vip := range []string{vip4, vip6} {
			for _, mode := range []string{"udp", "udpun"} {
				var r struct {
					Peer              string
					Sources, Backends []string
					Exact             bool
				}
				svcRun(t, c, &r, mode, vip, "53", "20")
				want := hostport(netip.MustParseAddr(vip), 53)
				if mode == "udp" && r.Peer != want {
					t.Errorf("%s to %s: getpeername %s, want %s", mode, vip, r.Peer, want)
				}
				if !slices.Equal(r.Sources, []string{want}) || len(r.Backends) != 1 || !slices.Contains(web, r.Backends[0]) || !r.Exact {
					t.Errorf("%s to %s: replies from %v (want only %s), backends %v (want one of %v), exact %v", mode, vip, r.Sources, want, r.Backends, web, r.Exact)
				}
			}
		}
	})
	t.Run("no backends", func(t *testing.T) {
		for _, p := range [][2]string{{empty4, rej4}, {empty6, rej6}} {
			var got, ref struct{ Result string }
			svcRun(t, c, &ref, "connerr", p[1], "80")
			svcRun(t, c, &got, "connerr", p[0], "80")
			t.Logf("connect to %s (no backends): %s; to %s behind iptables REJECT: %s", p[0], got.Result, p[1], ref.Result)
			if ref.Result == "ok" || got.Result != ref.Result {
				t.Errorf("connect to %s (no backends): %s; to %s behind iptables REJECT: %s", p[0], got.Result, p[1], ref.Result)
			}
		}
	})
	t.Run("backends replaced under load", func(t *testing.T) {
		a := svcPy("loop", vip4, "80")
		cmd := c.Cmd(context.Background(), a[0], a[1:]...)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(cmd); err != nil {
			t.Fatal(err)
		}
		defer func() { stdin.Close(); cmd.Wait() }()
		lines := make(chan string, 1024)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		seen := map[string]int{}
		var errs []string
		next := func() string {
			t.Helper()
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("loop client ended; seen %v", seen)
				}
				if strings.HasPrefix(l, "err:") {
					errs = append(errs, l)
				}
				seen[l]++
				return l
			case <-time.After(20 * time.Second):
				t.Fatalf("no connection for 20 s; seen %v", seen)
			}
			return ""
		}
		for range 40 {
			next()
		}
		if seen["b3"] > 0 || seen["b1"] == 0 || seen["b2"] == 0 {
			t.Errorf("before the change: %v, want b1 and b2 only", seen)
		}
		// b1 is replaced gracefully: still alive, so its connections stay
		// (a backend gone altogether has its TCP connections destroyed).
		draining = []*netlab.Pod{bs[0]}
		defer func() { draining = nil }()
		writeServices(t, svcFile, file(bs[1], bs[2]))
		for next() != "b3" {
		}
		after := map[string]int{}
		for range 40 {
			after[next()]++
		}
		if after["b1"] > 0 || after["b3"] == 0 || after["b2"] == 0 {
			t.Errorf("after replacing b1 by b3: %v, want b2 and b3 only", after)
		}
		if len(errs) > 0 {
			t.Errorf("%d failed connections while backends changed: %v", len(errs), errs[:min(len(errs), 5)])
		}
	})
	t.Run("udp backend removed", func(t *testing.T) {
		// An unconnected UDP socket keeps its backend while it stays one of
		// the frontend's, and chooses again once it is removed.
		a := svcPy("udpsticky", vip4, "53")
		cmd := c.Cmd(context.Background(), a[0], a[1:]...)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(cmd); err != nil {
			t.Fatal(err)
		}
		defer func() { stdin.Close(); cmd.Wait() }()
		sc := bufio.NewScanner(stdout)
		type burst struct{ Sources, Backends []string }
		read := func() burst {
			t.Helper()
			if !sc.Scan() {
				t.Fatalf("udpsticky ended: %v", sc.Err())
			}
			var b burst
			if err := json.Unmarshal(sc.Bytes(), &b); err != nil {
				t.Fatalf("%v: %q", err, sc.Text())
			}
			return b
		}
		want := []string{hostport(netip.MustParseAddr(vip4), 53)}
		first := read()
		if len(first.Backends) != 1 || !slices.Equal(first.Sources, want) {
			t.Fatalf("first burst: %+v", first)
		}
		var keep *netlab.Pod
		for _, p := range dns {
			if p.Name != first.Backends[0] {
				keep = p
			}
		}
		syncs := scrape(t, metricsAddr)["eztunnel_services_sync_seconds_count"]
		repick := scrape(t, metricsAddr)[`eztunnel_services_failures_total{reason="udp_repick"}`]
		dns = []*netlab.Pod{keep}
		writeServices(t, svcFile, file(bs[1], bs[2]))
		for deadline := time.Now().Add(scaled(10 * time.Second)); scrape(t, metricsAddr)["eztunnel_services_sync_seconds_count"] == syncs; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the agent did not apply the changed file in 10 s")
			}
		}
		io.WriteString(stdin, "go\n")
		second := read()
		if !slices.Equal(second.Backends, []string{keep.Name}) || !slices.Equal(second.Sources, want) {
			t.Errorf("after removing %s: %+v, want backend %s from %v", first.Backends[0], second, keep.Name, want)
		}
		if r := scrape(t, metricsAddr)[`eztunnel_services_failures_total{reason="udp_repick"}`]; r != repick+1 {
			t.Errorf("udp_repick %v, want %v", r, repick+1)
		}
	})
	t.Run("session affinity", func(t *testing.T) {
		hits := scrape(t, metricsAddr)["eztunnel_services_affinity_hits_total"]
		seen := map[string]int{}
		for range 10 {
			var r struct {
				Peer, Backend string
				Exact         bool
			}
			svcRun(t, c, &r, "tcp", sticky4, "80", "1000")
			if r.Peer != sticky4+":80" || !r.Exact {
				t.Errorf("TCP to %s: getpeername %s, exact %v", sticky4, r.Peer, r.Exact)
			}
			seen[r.Backend]++
		}
		if len(seen) != 1 {
			t.Errorf("one client, sessionAffinity ClientIP: backends %v, want one", seen)
		}
		if h := scrape(t, metricsAddr)["eztunnel_services_affinity_hits_total"]; h-hits != 9 {
			t.Errorf("%v affinity hits for 10 connections, want 9", h-hits)
		}
	})
	t.Run("shortcut pairs translated connections", func(t *testing.T) {
		// The socket never carries the ClusterIP: both ends are local and
		// managed, so the shortcut pairs them with nothing to learn from NAT.
		before := pinnedCounters(t, pin)
		for i := range 6 {
			var r struct {
				Peer, Backend string
				Exact         bool
			}
			svcRun(t, c, &r, "tcp", near4, "80", fmt.Sprint(1<<20+i))
			if r.Peer != near4+":80" || r.Backend != "b4" || !r.Exact {
				t.Errorf("TCP to %s: getpeername %s, backend %q, exact %v", near4, r.Peer, r.Backend, r.Exact)
			}
		}
		d := delta(before, pinnedCounters(t, pin))
		requirePaired(t, d, 6, 1, "connections through the ClusterIP to a managed pod")
		if d["nat_aliases"] != 0 {
			t.Errorf("%d NAT aliases learnt for connections translated at connect", d["nat_aliases"])
		}
	})
	t.Run("metrics", func(t *testing.T) {
		m := scrape(t, metricsAddr)
		for k, want := range map[string]float64{
			"eztunnel_services_frontends":                               8,
			"eztunnel_services_backend_slots":                           9,
			`eztunnel_services_skipped{reason="protocol"}`:              1,
			`eztunnel_services_up`:                                      1,
			`eztunnel_services_failures_total{reason="no_backend"}`:     2,
			`eztunnel_services_reverse_translations_total{kind="recv"}`: 90,
			`eztunnel_services_translations_total{kind="udp_connect"}`:  2,
		} {
			if m[k] != want {
				t.Errorf("%s = %v, want %v", k, m[k], want)
			}
		}
		if v := m[`eztunnel_services_translations_total{kind="tcp_connect"}`]; v < 104 {
			t.Errorf("tcp_connect translations %v, want at least 104", v)
		}
		if v := m[`eztunnel_services_translations_total{kind="udp_send"}`]; v != 50 {
			t.Errorf("udp_send translations %v, want 50 (unconnected datagrams)", v)
		}
		if v := m["eztunnel_services_sync_seconds_count"]; v < 2 {
			t.Errorf("sync latency observed %v times, want the start and the change", v)
		}
	})

	t.Run("proxy learns the ClusterIP", func(t *testing.T) {
		// A REDIRECT target in the client's netns asks SO_ORIGINAL_DST
		// (IPv4) and IP6T_SO_ORIGINAL_DST (IPv6): the answer is the
		// ClusterIP the application connected to, not the backend the
		// connect was translated to (conntrack's original destination).
		o := e.pod("o", true)
		for _, ipt := range []string{"iptables", "ip6tables"} {
			nsExec(t, o.NetNS, ipt, "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15001")
		}
		_, sc, errb := startSvcPy(t, o, "origdst", "15001", "2")
		defer func() {
			if t.Failed() {
				t.Logf("origdst stderr: %s", errb.String())
			}
		}()
		if !sc.Scan() || sc.Text() != "listening" {
			t.Fatalf("origdst: %q %v %s", sc.Text(), sc.Err(), errb.String())
		}
		before := scrape(t, metricsAddr)
		for _, vip := range []string{vip4, vip6} {
			var r struct {
				Peer, Backend string
			}
			svcRun(t, o, &r, "tcp", vip, "80", "0")
			want := hostport(netip.MustParseAddr(vip), 80)
			if r.Backend != "origdst" || r.Peer != want {
				t.Errorf("%s: %+v, want the REDIRECT target and the ClusterIP as peer", vip, r)
			}
			if !sc.Scan() {
				t.Fatalf("origdst ended: %v %s", sc.Err(), errb.String())
			}
			var got struct{ Orig string }
			if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.Orig != want {
				t.Errorf("SO_ORIGINAL_DST of a connection to %s: %s, want %s", vip, got.Orig, want)
			}
		}
		k := `eztunnel_services_reverse_translations_total{kind="original_dst"}`
		if d := scrape(t, metricsAddr)[k] - before[k]; d != 2 {
			t.Errorf("%s grew by %v, want 2", k, d)
		}

		// A real sidecar: HAProxy behind Istio's REDIRECT capture forwards
		// to the original destination, so it connects to the ClusterIP
		// itself (translated again, as the proxy's own connection).
		sp := e.pod("sp", true)
		if err := meshlab.InstallCapture(context.Background(), sp, meshlab.SidecarCapture()); err != nil {
			t.Fatal(err)
		}
		e.startSidecar(sp)
		before = scrape(t, metricsAddr)
		for i := range 3 {
			var r struct {
				Peer, Backend string
				Exact         bool
			}
			svcRun(t, sp, &r, "tcp", vip4, "80", fmt.Sprint(64<<10+i))
			if !r.Exact || r.Peer != hostport(netip.MustParseAddr(vip4), 80) || !slices.Contains([]string{"b1", "b2", "b3"}, r.Backend) {
				t.Errorf("through the sidecar: %+v", r)
			}
		}
		after := scrape(t, metricsAddr)
		tc := `eztunnel_services_translations_total{kind="tcp_connect"}`
		if d, o := after[tc]-before[tc], after[k]-before[k]; d != 6 || o != 3 {
			t.Errorf("3 connections through the sidecar: %v TCP translations (want 6: the application's and the proxy's), %v SO_ORIGINAL_DST answers (want 3)", d, o)
		}
	})

	t.Run("pod left to its proxy", func(t *testing.T) {
		// A pod whose own interception catches every TCP connection but its
		// proxy's (Istio's REDIRECT rule: the proxy's uid excluded), and a
		// proxy that forwards to SO_ORIGINAL_DST. Default choice: the
		// application's connect is translated at the socket and the
		// getsockopt hook answers the ClusterIP. Left to its proxy: the
		// application's connect is not translated, so conntrack itself
		// answers the ClusterIP, exactly as it answers a VIP that a
		// kube-proxy-like DNAT in the host's PREROUTING serves (the
		// reference); the proxy's own connect is translated. Bytes are
		// exact every way. Then the choice survives a restart (pinned), and
		// goes with the file's entry.
		const proxyUID, ref4 = "1337", "10.96.93.70"
		px := e.pod("px", true)
		for _, ipt := range []string{"iptables", "ip6tables"} {
			nsExec(t, px.NetNS, ipt, "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-m", "owner", "!", "--uid-owner", proxyUID,
				"-j", "REDIRECT", "--to-ports", "15001")
		}
		hostDNAT(t, e.lab, netip.MustParseAddr(ref4), hostport(bs[2].IPv4, 8080))
		nsExec(t, bs[2].NetNS, "ip", "route", "add", px.IPv4.String()+"/32", "via", e.lab.GatewayV4.String())
		_, sc, errb := startSvcPy(t, px, "proxy", "15001", proxyUID)
		defer func() {
			if t.Failed() {
				t.Logf("proxy stderr: %s", errb.String())
			}
		}()
		if !sc.Scan() || sc.Text() != "listening" {
			t.Fatalf("proxy: %q %v %s", sc.Text(), sc.Err(), errb.String())
		}
		type seen struct {
			Orig, Upstream string // the proxy's SO_ORIGINAL_DST answer, its upstream's getpeername
			Peer, Backend  string // the application's getpeername, the backend that answered
			Exact          bool
		}
		through := func(when, host string) seen {
			t.Helper()
			var r struct {
				Peer, Backend string
				Exact         bool
			}
			svcRun(t, px, &r, "tcp", host, "80", fmt.Sprint(200<<10))
			if !sc.Scan() {
				t.Fatalf("%s: proxy ended: %v %s", when, sc.Err(), errb.String())
			}
			var p struct {
				Orig         string `json:"orig"`
				UpstreamPeer string `json:"upstream_peer"`
			}
			if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
				t.Fatalf("%s: %v: %q", when, err, sc.Text())
			}
			return seen{Orig: p.Orig, Upstream: p.UpstreamPeer, Peer: r.Peer, Backend: r.Backend, Exact: r.Exact}
		}
		vip := hostport(netip.MustParseAddr(vip4), 80)
		ref := hostport(netip.MustParseAddr(ref4), 80)
		web := []string{"b2", "b3"} // as the earlier subtests left the file
		const (
			tcpK  = `eztunnel_services_translations_total{kind="tcp_connect"}`
			origK = `eztunnel_services_reverse_translations_total{kind="original_dst"}`
			leftK = "eztunnel_services_left_to_proxy_total"
			podsK = "eztunnel_services_proxied_pods"
		)
		check := func(when string, left bool) {
			t.Helper()
			before := scrape(t, metricsAddr)
			got := through(when, vip4)
			after := scrape(t, metricsAddr)
			if got.Orig != vip || got.Upstream != vip || got.Peer != vip || !got.Exact || !slices.Contains(web, got.Backend) {
				t.Errorf("%s: %+v, want SO_ORIGINAL_DST, the proxy's and the application's peers all %s, exact bytes from a web backend", when, got, vip)
				// What the services datapath counted meanwhile (a miss of
				// ez_svc_origdst: orig_full, or no orig_dst answer).
				var d []string
				for k, v := range after {
					if strings.HasPrefix(k, "eztunnel_services_") && v != before[k] {
						d = append(d, fmt.Sprintf("%s %+g", k, v-before[k]))
					}
				}
				slices.Sort(d)
				t.Logf("%s: services metrics that changed: %s", when, strings.Join(d, ", "))
			}
			// Default: both connects translated, the answer the hook's.
			// Left to the proxy: the proxy's only, the answer conntrack's.
			wantTCP, wantOrig, wantLeft := 2.0, 1.0, 0.0
			if left {
				wantTCP, wantOrig, wantLeft = 1, 0, 1
			}
			if d := after[tcpK] - before[tcpK]; d != wantTCP {
				t.Errorf("%s: %v TCP connects translated, want %v", when, d, wantTCP)
			}
			if d := after[origK] - before[origK]; d != wantOrig {
				t.Errorf("%s: %v SO_ORIGINAL_DST answers by the hook, want %v", when, d, wantOrig)
			}
			if d := after[leftK] - before[leftK]; d != wantLeft {
				t.Errorf("%s: %v connects left to the proxy, want %v", when, d, wantLeft)
			}
			t.Logf("%s: the proxy saw %s, its upstream %s; backend %s", when, got.Orig, got.Upstream, got.Backend)
		}
		// kube-proxy's way, for reference: nothing at the socket (the VIP is
		// no frontend), DNAT in the host.
		r := through("reference (host DNAT)", ref4)
		if r.Orig != ref || r.Upstream != ref || r.Peer != ref || !r.Exact || r.Backend != "b3" {
			t.Fatalf("reference through a host DNAT: %+v, want %s everywhere, exact bytes from b3", r, ref)
		}

		check("default choice", false)
		if p := scrape(t, metricsAddr)[podsK]; p != 0 {
			t.Errorf("%s %v, want 0", podsK, p)
		}

		waitSync := func(what string, ok func(m map[string]float64) bool) {
			t.Helper()
			for deadline := time.Now().Add(scaled(10 * time.Second)); !ok(scrape(t, metricsAddr)); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: not applied in 10 s", what)
				}
			}
		}
		proxied = fmt.Sprintf("proxied:\n- {cgroup: %q, choice: \"proxy:%s\"}\n", px.Cgroup, proxyUID)
		writeServices(t, svcFile, file(bs[1], bs[2]))
		waitSync("pod left to its proxy", func(m map[string]float64) bool { return m[podsK] == 1 })
		check("left to its proxy", true)
		// What the proxy learns is what kube-proxy's DNAT gives it: the
		// address the application connected to, from conntrack.
		t.Logf("the proxy learns %s for the ClusterIP (conntrack, no hook) as %s for the host-DNAT VIP", vip, ref)

		// The choice is pinned: it holds with no agent and after a restart.
		stopAgent(t)
		var p struct{ Orig string }
		var cr struct {
			Peer, Backend string
			Exact         bool
		}
		left0 := pinnedSvcCounter(t, pin, "left_to_proxy")
		svcRun(t, px, &cr, "tcp", vip4, "80", "1000")
		if !sc.Scan() || json.Unmarshal(sc.Bytes(), &p) != nil {
			t.Fatalf("agent stopped: proxy: %q %v %s", sc.Text(), sc.Err(), errb.String())
		}
		if p.Orig != vip || !cr.Exact || cr.Peer != vip || pinnedSvcCounter(t, pin, "left_to_proxy") != left0+1 {
			t.Errorf("agent stopped: proxy saw %s, application %+v, left_to_proxy %d -> %d", p.Orig, cr, left0, pinnedSvcCounter(t, pin, "left_to_proxy"))
		}
		startAgent(t)
		check("after a restart", true)

		// A choice that does not parse fails the file: what is written stays.
		const bad = `choice \"proxy:abc\"`
		n0 := strings.Count(logs.String(), bad)
		good := proxied
		proxied = "proxied:\n- {cgroup: /sys/fs/cgroup/x, choice: proxy:abc}\n"
		writeServices(t, svcFile, file(bs[1], bs[2]))
		proxied = good
		for deadline := time.Now().Add(scaled(10 * time.Second)); strings.Count(logs.String(), bad) == n0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("a bad proxied entry was not reported in 10 s:\n%s", logs.String())
			}
		}
		check("bad entry ignored", true)

		proxied = ""
		writeServices(t, svcFile, file(bs[1], bs[2]))
		waitSync("pod translated at the socket again", func(m map[string]float64) bool { return m[podsK] == 0 })
		check("choice removed", false)
	})

	t.Run("restart keeps translated sockets", func(t *testing.T) {
		// A TCP connection and a connected UDP socket translated by this
		// agent keep their backend and keep seeing the ClusterIP (getpeername,
		// UDP reply source) while the agent is stopped and after a new one
		// adopted the pinned load balancer.
		next := startHold(t, c, vip4, "80", vip4, "53")
		var first holdRound
		check := func(when string) {
			t.Helper()
			r := next(when)
			tcpVIP, udpVIP := hostport(netip.MustParseAddr(vip4), 80), hostport(netip.MustParseAddr(vip4), 53)
			if r.TCPError != "" || r.UDPError != "" || !r.TCPExact || !r.UDPExact || r.TCPPeer != tcpVIP || r.UDPPeer != udpVIP || r.UDPSource != udpVIP {
				t.Errorf("%s: %+v, want exact echoes and %s / %s as peers and reply source", when, r, tcpVIP, udpVIP)
			}
			if first.TCPBackend == "" {
				first = r
			} else if r.TCPBackend != first.TCPBackend || r.UDPBackend != first.UDPBackend {
				t.Errorf("%s: backends %s / %s, were %s / %s", when, r.TCPBackend, r.UDPBackend, first.TCPBackend, first.UDPBackend)
			}
		}
		check("before the restart")
		stopAgent(t)
		if n := lbPrograms(t, e.lab.Managed); n != lbHooks {
			t.Errorf("%d load-balancer programs on the managed cgroup after the agent stopped, want the %d pinned", n, lbHooks)
		}
		check("agent stopped")
		// A Service deleted while no agent runs: the next one deletes it.
		writeServices(t, svcFile, strings.Replace(file(bs[1], bs[2]), "- {name: sticky", "# - {name: sticky", 1))
		startAgent(t)
		if n := lbPrograms(t, e.lab.Managed); n != lbHooks {
			t.Errorf("%d load-balancer programs on the managed cgroup after the restart, want %d (updated in place)", n, lbHooks)
		}
		check("after the restart")
		if !strings.Contains(logs.String(), "adopting the frontends an earlier agent pinned") || !strings.Contains(logs.String(), "deleted frontends no Service has any more") {
			t.Errorf("the restarted agent did not adopt the pinned frontends and delete the stale one:\n%s", logs.String())
		}
		if f := scrape(t, metricsAddr)["eztunnel_services_frontends"]; f != 7 {
			t.Errorf("frontends after the restart %v, want 7 (sticky deleted)", f)
		}
		// eztunnel status reads the pinned load balancer.
		out, err := eztunnel(context.Background(), "status", "--pin-path", pin, "-o", "json")
		var st struct {
			Services *struct {
				Frontends, NodePorts, Cgroups int
				Counters                      map[string]uint64
			} `json:"services"`
		}
		if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.Services == nil {
			t.Fatalf("status: %v: %s", err, out)
		}
		if s := st.Services; s.Frontends != 7 || s.NodePorts != 0 || s.Cgroups != 1 || s.Counters["tcp_connect"] == 0 {
			t.Errorf("status: services %+v, want 7 frontends, no NodePort, 1 cgroup, TCP translations counted", *s)
		}
		// eztunnel services lists what the file says, read from the pins.
		out, err = eztunnel(context.Background(), "services", "--pin-path", pin, "-o", "json")
		var fes []struct {
			Frontend string
			NodePort bool
			Affinity uint32
			Backends []string
		}
		if err != nil || json.Unmarshal([]byte(out), &fes) != nil {
			t.Fatalf("eztunnel services: %v: %s", err, out)
		}
		listed := map[string][]string{}
		for _, f := range fes {
			listed[f.Frontend] = f.Backends
		}
		want := map[string][]string{
			hostport(netip.MustParseAddr(vip4), 80) + "/TCP":   {hostport(bs[1].IPv4, 8080), hostport(bs[2].IPv4, 8080)},
			hostport(netip.MustParseAddr(vip6), 80) + "/TCP":   {hostport(bs[1].IPv6, 8080), hostport(bs[2].IPv6, 8080)},
			hostport(netip.MustParseAddr(empty4), 80) + "/TCP": {},
			hostport(netip.MustParseAddr(near4), 80) + "/TCP":  {hostport(near.IPv4, 8080)},
		}
		for f, bes := range want {
			slices.Sort(bes)
			if got, ok := listed[f]; !ok || !slices.Equal(got, bes) {
				t.Errorf("eztunnel services: %s: %v (listed %v), want %v", f, got, ok, bes)
			}
		}
		if len(fes) != 7 {
			t.Errorf("eztunnel services: %d frontends, want 7: %s", len(fes), out)
		}
		var r struct {
			Peer, Backend string
			Exact         bool
		}
		svcRun(t, c, &r, "tcp", vip4, "80", "1000")
		if !r.Exact || r.Peer != hostport(netip.MustParseAddr(vip4), 80) {
			t.Errorf("a new connection after the restart: %+v", r)
		}
	})

	t.Run("removed backend's sockets destroyed", func(t *testing.T) {
		// A TCP connection and a connected UDP socket translated to a
		// backend that leaves its frontend are destroyed; the same
		// application's sockets connected to that backend's own address
		// are not.
		if rep := statusParts(t, pin); !rep.Runs(parts.SocketDestroy) {
			st, _ := rep.Get(parts.SocketDestroy)
			if st.Reason == "" {
				t.Fatalf("socket-destroy is off without a reason: %+v", rep.Parts)
			}
			t.Logf("KNOWN KERNEL LIMIT (Linux %s): socket destruction is off: %s", kernelRelease(t), st.Reason)
			return
		}
		// sock_diag where the kernel has no bpf_sock_destroy (before 6.5)
		// or a test refuses it.
		st, _ := statusParts(t, pin).Get(parts.SocketDestroy)
		spec, err := btf.LoadKernelSpec()
		if err != nil {
			t.Fatal(err)
		}
		var fn *btf.Func
		noKfunc := spec.TypeByName("bpf_sock_destroy", &fn) != nil
		if diag := strings.Contains(st.Via, "sock_diag"); diag != (noKfunc || strings.Contains(os.Getenv(bpfsys.TestRefuseEnv), "ez_svc_destroy_tcp")) {
			t.Fatalf("socket-destroy %+v: sock_diag %v, kernel without bpf_sock_destroy %v, %s=%q", st, diag, noKfunc, bpfsys.TestRefuseEnv, os.Getenv(bpfsys.TestRefuseEnv))
		}
		t.Logf("socket-destroy via %s", st.Via)
		held := startHold(t, c, vip4, "80", vip4, "53")
		r := held("translated")
		if r.TCPError != "" || r.UDPError != "" {
			t.Fatalf("translated sockets: %+v", r)
		}
		podOf := func(name string) *netlab.Pod {
			for _, p := range bs {
				if p.Name == name {
					return p
				}
			}
			t.Fatalf("no backend pod %q", name)
			return nil
		}
		tcpBe, udpBe := podOf(r.TCPBackend), podOf(r.UDPBackend)
		direct := startHold(t, c, tcpBe.IPv4.String(), "8080", udpBe.IPv4.String(), "8080")
		if d := direct("direct"); d.TCPError != "" || d.UDPError != "" {
			t.Fatalf("direct sockets: %+v", d)
		}
		before := scrape(t, metricsAddr)
		var web []*netlab.Pod
		for _, p := range bs {
			if p != tcpBe {
				web = append(web, p)
			}
		}
		dns = nil
		for _, p := range bs {
			if p != udpBe {
				dns = append(dns, p)
			}
		}
		writeServices(t, svcFile, strings.Replace(file(web...), "- {name: sticky", "# - {name: sticky", 1))
		// The file's Services are applied one at a time, in no set order:
		// wait until both destructions are counted (each Service's sync
		// alone says nothing of the other's).
		destroyed := func(m map[string]float64, proto string) float64 {
			k := fmt.Sprintf(`eztunnel_services_sockets_destroyed_total{proto=%q}`, proto)
			return m[k] - before[k]
		}
		for deadline := time.Now().Add(scaled(10 * time.Second)); ; time.Sleep(20 * time.Millisecond) {
			if m := scrape(t, metricsAddr); destroyed(m, "tcp") >= 1 && destroyed(m, "udp") >= 1 {
				break
			}
			if time.Now().After(deadline) {
				break // the check below says which is missing
			}
		}
		after := scrape(t, metricsAddr)
		for _, p := range []string{"tcp", "udp"} {
			k := fmt.Sprintf(`eztunnel_services_sockets_destroyed_total{proto=%q}`, p)
			if d := after[k] - before[k]; d != 1 {
				t.Errorf("%s: %v destroyed, want 1", k, d)
			}
		}
		// TCP: aborted. Connected UDP: disconnected, so a send has no
		// destination; the pending error is seen by a receive.
		if r := held("after the removal"); r.TCPError != "ECONNABORTED" || r.UDPError != "EDESTADDRREQ" || r.UDPRecvErr != "ECONNABORTED" {
			t.Errorf("translated sockets after their backends left: %+v, want TCP ECONNABORTED, UDP send EDESTADDRREQ then receive ECONNABORTED", r)
		}
		if d := direct("after the removal"); d.TCPError != "" || d.UDPError != "" || !d.TCPExact || !d.UDPExact {
			t.Errorf("sockets connected to the backends' own addresses: %+v, want them untouched", d)
		}
		// The application's next connection goes to a remaining backend.
		var nr struct {
			Backend string
			Exact   bool
		}
		svcRun(t, c, &nr, "tcp", vip4, "80", "1000")
		if !nr.Exact || nr.Backend == tcpBe.Name {
			t.Errorf("a new connection after the removal: %+v", nr)
		}
	})

	t.Run("turned off", func(t *testing.T) {
		stopAgent(t)
		startAgent(t, "--services=false")
		if n := lbPrograms(t, e.lab.Managed); n != 0 {
			t.Errorf("%d load-balancer programs left on the managed cgroup with --services=false", n)
		}
		if !strings.Contains(logs.String(), "removed the Service load balancer an earlier agent pinned") {
			t.Errorf("no removal in the log:\n%s", logs.String())
		}
	})
	stopAgent(t)
}
