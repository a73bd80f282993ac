package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/bench/mesh"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// labLeftovers lists what a lab named name left behind: namespaces, links,
// its cgroup tree, processes in it, and the pin directory pin.
func labLeftovers(t *testing.T, name, pin string) []string {
	t.Helper()
	var left []string
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), netlab.Prefix+"-"+name+"-") {
			left = append(left, "netns "+e.Name())
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatalf("list links: %v", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, netlab.Prefix+name) {
			left = append(left, "link "+l.Attrs().Name)
		}
	}
	root, err := cgroupv2.Root()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, netlab.Prefix+"-"+name)); err == nil {
		left = append(left, "cgroup "+netlab.Prefix+"-"+name)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "/"+netlab.Prefix+"-"+name+"/") {
			continue
		}
		// A killed process whose parent died too is a zombie until init
		// reaps it: it holds no resources and is no longer in the cgroup.
		stat, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "stat"))
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "comm"))
		left = append(left, "process "+filepath.Base(filepath.Dir(p))+" "+strings.TrimSpace(string(comm)))
	}
	if pin != "" {
		if _, err := os.Stat(pin); err == nil {
			left = append(left, "pins "+pin)
		}
	}
	return left
}

func assertClean(t *testing.T, name, pin string) {
	t.Helper()
	if left := labLeftovers(t, name, pin); len(left) > 0 {
		t.Errorf("left behind: %s", strings.Join(left, "; "))
	}
}

// TestLabTopology builds nodes of every mesh kind (with TLS where there
// are proxies), checks their processes and capture rules, and that Close
// and a failing New leave nothing behind.
func TestLabTopology(t *testing.T) {
	for _, mesh := range []string{"sidecar-tls", "ambient"} {
		m, _ := meshlab.ParseMesh(mesh)
		n, err := meshlab.New(context.Background(), meshlab.Config{Name: "lb1", Subnet: 50, Mesh: m, Exe: labBin})
		if err != nil {
			t.Fatalf("%s: %v", mesh, err)
		}
		var names []string
		for _, p := range n.Procs() {
			names = append(names, p.Name)
		}
		want := map[string]string{"sidecar-tls": "echo redis-server nginx haproxy-cli haproxy-srv",
			"ambient": "echo redis-server nginx haproxy-node"}[mesh]
		if got := strings.Join(names, " "); got != want {
			t.Errorf("%s: processes %q, want %q", mesh, got, want)
		}
		rules, _ := nsTry(n.Client.NetNS, "iptables", "-w", "-t", "nat", "-S")
		wantRule := "--to-ports 15001"
		if n.Proxy != nil {
			wantRule = "--to-destination " + n.Proxy.IPv4.String()
		}
		if !strings.Contains(rules, wantRule) {
			t.Errorf("%s: client capture lacks %q:\n%s", mesh, wantRule, rules)
		}
		if err := n.Close(); err != nil {
			t.Errorf("%s: close: %v", mesh, err)
		}
		assertClean(t, "lb1", "")
	}

	// A server that cannot start: New fails and removes what it made.
	_, err := meshlab.New(context.Background(), meshlab.Config{Name: "lb1", Subnet: 50, Mesh: meshlab.Mesh{Kind: "sidecar"}, Exe: "/nonexistent/eztunnel"})
	if err == nil {
		t.Fatal("New with a missing binary succeeded")
	}
	assertClean(t, "lb1", "")
}

// tinyLab is the smallest complete `bench lab` run: every workload, one
// round of four runs, no paired ping-echo (TestLabPairedB2B) (--quick alone measures six rounds of fewer
// workloads; one round has no interval and judges nothing). Its pin path is recorded by a holder of this process, so a
// killed run's pins are swept.
func tinyLab(t *testing.T, name string, subnet int, out string, meshes string) *exec.Cmd {
	t.Helper()
	h, err := netlab.Holder("p" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("pin holder: %v", err)
		}
	})
	if _, err := h.Record(netlab.RecPin, "/sys/fs/bpf/ez"+name); err != nil {
		t.Fatal(err)
	}
	return sysexec.Command(context.Background(), labBin, "bench", "lab", "--quick", "--lab-name", name, "--subnet", strconv.Itoa(subnet),
		"--pin-path", "/sys/fs/bpf/ez"+name, "--mesh", meshes, "--reps", "1", "--workload", strings.Join(mesh.Workloads, ","), "--paced-n", "3", "--interval", "20ms",
		"--ping-n", "300", "--transfer-mib", "8", "--redis-n", "1000", "--http-duration", "1s", "--b2b-pairs", "0", "--out", out)
}

// TestLabWorkloads runs every workload once per mode in three mesh modes
// and checks each metric is sane and the report rendered.
func TestLabWorkloads(t *testing.T) {
	out := t.TempDir()
	cmd := tinyLab(t, "lb3", 52, out, "none,sidecar,ambient-tls")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench lab: %v\n%s\n%s", err, stderr.String(), stdout.String())
	}
	assertClean(t, "lb3", "/sys/fs/bpf/ezlb3")
	if !strings.Contains(stdout.String(), "| sidecar ") || !strings.Contains(stdout.String(), "redis OPS") {
		t.Errorf("main table missing rows:\n%s", stdout.String())
	}
	runs, _, err := mesh.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3*4*len(mesh.Workloads) {
		t.Fatalf("%d runs, want %d", len(runs), 3*4*len(mesh.Workloads))
	}
	for _, r := range runs {
		id := r.Mesh + " " + r.Mode + " " + r.Workload
		// /proc/stat counts 10 ms ticks: tiny runs may see none.
		if r.CPU < 0 || (r.CPU == 0 && r.Workload == mesh.WHTTP) || r.MemUsed <= 0 || r.Seconds <= 0 || r.Ops <= 0 || r.Rate <= 0 {
			t.Errorf("%s: cpu %v mem %v seconds %v ops %v rate %v", id, r.CPU, r.MemUsed, r.Seconds, r.Ops, r.Rate)
		}
		if l := r.Latency; l.P50 <= 0 || l.P50 > 100e3 || l.Mean <= 0 || l.P99 < l.P50 {
			if r.Workload != mesh.WTransfer {
				t.Errorf("%s: latency %+v", id, l)
			}
		}
		switch r.Workload {
		case mesh.WPaced, mesh.WB2B:
			if len(r.Samples) != r.Latency.N || r.Latency.StdDev <= 0 || r.Latency.PDV <= 0 {
				t.Errorf("%s: %d samples, summary %+v", id, len(r.Samples), r.Latency)
			}
		case mesh.WTransfer:
			if r.FCT <= 0 || r.FCT > 60 {
				t.Errorf("%s: FCT %v", id, r.FCT)
			}
		}
		if r.Mode == mesh.ModeEztunnel && (r.Counters["pairs"] == 0 || r.BPFMaps <= 0) {
			t.Errorf("%s: not accelerated: pairs %d, maps %.1f MB", id, r.Counters["pairs"], r.BPFMaps)
		}
		if r.Mode != mesh.ModeEztunnel && len(r.Counters) != 0 {
			t.Errorf("%s: baseline has datapath counters %v", id, r.Counters)
		}
	}
	for _, f := range []string{"summary.md", "runs.csv", "machine.json", "plots/cdf-ping-echo-b2b.svg", "plots/box-redis-ops.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestLabPairedB2B runs the demo's paired ping-echo alone, a few quads of
// short phases per mesh mode, and checks the report: a paired b2b row with
// its A/A, and counters that prove every B phase accelerated (connections
// paired, messages redirected) and no A or A/A phase (none paired, none
// redirected, connections excluded).
func TestLabPairedB2B(t *testing.T) {
	out := t.TempDir()
	h, err := netlab.Holder("plb4")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("pin holder: %v", err)
		}
	})
	if _, err := h.Record(netlab.RecPin, "/sys/fs/bpf/ezlb4"); err != nil {
		t.Fatal(err)
	}
	stdout := runLab(t, "bench", "lab", "--quick", "--lab-name", "lb4", "--subnet", "54",
		"--pin-path", "/sys/fs/bpf/ezlb4", "--mesh", "none,sidecar,ambient", "--workload", "", "--b2b-pairs", "6", "--b2b-phase", "20ms",
		"--b2b-conns", "2", "--out", out)
	assertClean(t, "lb4", "/sys/fs/bpf/ezlb4")
	paired, err := mesh.LoadPaired(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"none", "sidecar", "ambient"} {
		if !strings.Contains(stdout, "| "+m+" ") {
			t.Errorf("no %s row:\n%s", m, stdout)
		}
		p, ok := paired[m]
		if !ok {
			t.Errorf("%s: no paired result", m)
			continue
		}
		if p.AA().Pairs != 6 || p.AB().Pairs != 6 {
			t.Errorf("%s: A/A %v, A/B %v: want 6 pairs each", m, p.AA(), p.AB())
		}
		b := p.Counters[bench.SideB]
		if !p.Verified() || b["pairs"] < 6*2 || b["messages_redirected"] < uint64(p.N[bench.SideB]) {
			t.Errorf("%s: B phases not accelerated: %v (%d round trips), verified %v", m, b, p.N[bench.SideB], p.Verified())
		}
		for _, s := range []bench.Side{bench.SideA, bench.SideAA1, bench.SideAA2} {
			if c := p.Counters[s]; c["pairs"] != 0 || c["messages_redirected"] != 0 || c["fallback_excluded"] < 6*2 || p.N[s] == 0 {
				t.Errorf("%s: side %d (kernel path) counters %v, %d round trips", m, s, c, p.N[s])
			}
		}
	}
	if !strings.Contains(stdout, "ping-echo b2b p50 (us), paired phases") || !strings.Contains(stdout, "ping-echo-b2b p50 (paired phases)") ||
		strings.Count(stdout, ": B accelerated, A not") != 3 {
		t.Errorf("paired rows, targets or counter notes missing:\n%s", stdout)
	}
}

// TestLabPairedB2BNaive runs the paired ping-echo with its B phases on
// the lab's naive sockmap (--b2b-datapath naive, the bound eztunnel is
// compared with): B must be redirected by it and A left out of it by the
// excluded ports, and the rows must say B was not eztunnel.
func TestLabPairedB2BNaive(t *testing.T) {
	out := t.TempDir()
	stdout := runLab(t, "bench", "lab", "--quick", "--lab-name", "lb5", "--subnet", "55",
		"--pin-path", "/sys/fs/bpf/ezlb5", "--mesh", "sidecar", "--workload", "", "--b2b-pairs", "6", "--b2b-phase", "20ms",
		"--b2b-conns", "2", "--b2b-datapath", "naive", "--out", out)
	assertClean(t, "lb5", "/sys/fs/bpf/ezlb5")
	paired, err := mesh.LoadPaired(out)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := paired["sidecar"]
	if !ok || !p.Naive() {
		t.Fatalf("no paired sidecar result on the naive sockmap: %+v", paired)
	}
	if p.AA().Pairs != 6 || p.AB().Pairs != 6 {
		t.Errorf("A/A %v, A/B %v: want 6 pairs each", p.AA(), p.AB())
	}
	// Three legs a connection, two sockets a leg; six redirects a round trip.
	b := p.Counters[bench.SideB]
	if !p.Verified() || b["inserted"] < 6*2*6 || b["redirect_by_tuple"]+b["redirect_by_client"] < 6*uint64(p.N[bench.SideB]) || b["skipped"] != 0 {
		t.Errorf("B phases not all redirected by the naive sockmap: %v (%d round trips), verified %v", b, p.N[bench.SideB], p.Verified())
	}
	for _, s := range []bench.Side{bench.SideA, bench.SideAA1, bench.SideAA2} {
		if c := p.Counters[s]; c["inserted"] != 0 || c["redirect_by_tuple"]+c["redirect_by_client"] != 0 || c["skipped"] < 6*2*6 || p.N[s] == 0 {
			t.Errorf("side %d (kernel path) counters %v, %d round trips", s, c, p.N[s])
		}
	}
	if !strings.Contains(stdout, "ping-echo-b2b p50 (paired phases, B: naive sockmap)") {
		t.Errorf("the target row does not say B took the naive sockmap:\n%s", stdout)
	}
}

// TestLabInterrupt sends SIGINT to a running `bench lab` and checks it
// exits and leaves nothing behind: no namespaces, links, cgroups,
// processes (haproxy, nginx, redis-server) or pins.
func TestLabInterrupt(t *testing.T) {
	cmd := tinyLab(t, "lb2", 51, t.TempDir(), "sidecar")
	var stderr logbuf.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	// Interrupt in the middle of the first eztunnel-mode run: once the
	// datapath is pinned, every proxy and server is running.
	pin := "/sys/fs/bpf/ezlb2"
	for {
		if links, _ := filepath.Glob(filepath.Join(pin, "*", "links", "cgroup", "*", "ez_sc_sockops")); len(links) > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("the datapath was never pinned in %s:\n%s", pin, stderr.String())
		}
		select {
		case err := <-done:
			t.Fatalf("bench lab exited (%v) before the datapath was pinned:\n%s", err, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(stderr.String(), "interrupted") {
			t.Errorf("exit %v after SIGINT:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("did not exit after SIGINT:\n%s", stderr.String())
	}
	assertClean(t, "lb2", pin)
}

// runLab runs the lab binary with args, fails the test if it fails, and
// returns its standard output.
func runLab(t *testing.T, args ...string) string {
	t.Helper()
	cmd := sysexec.Command(context.Background(), labBin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("eztunnel-lab %s: %v\n%s\n%s", strings.Join(args[:min(2, len(args))], " "), err, stderr.String(), stdout.String())
	}
	return stdout.String()
}
