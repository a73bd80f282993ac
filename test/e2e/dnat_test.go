package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// Virtual (ClusterIP-like) addresses: nothing owns them, DNAT sends them to pods.
var (
	podVIP  = netip.MustParseAddr("10.96.0.10") // DNAT in the client pod's OUTPUT
	hostVIP = netip.MustParseAddr("10.96.0.11") // DNAT in the host's PREROUTING (kube-proxy)
)

// podDNAT adds `-d vip --dport 80 -j DNAT --to-destination to` to the nat
// OUTPUT chain of p's netns (it goes away with the netns).
func podDNAT(t *testing.T, p *netlab.Pod, vip netip.Addr, to string) {
	t.Helper()
	nsExec(t, p.NetNS, "iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-d", vip.String()+"/32",
		"-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", to)
}

// hostDNAT makes the host a kube-proxy for vip:80 -> to, for traffic coming
// from the lab's bridge: iptables (as kube-proxy drives it) adds a chain of
// our own to nat PREROUTING, and IPv4 forwarding is on. Each host change is
// recorded in the lab's owner record first, so a killed run's leftovers are
// swept; cleanup (also on failure) undoes them: the jump and the chain, the
// nat table iptables-nft made if it was not there before, ip_forward.
func hostDNAT(t *testing.T, l *netlab.Lab, vip netip.Addr, to string) {
	t.Helper()
	chain := "EZL-DNAT-" + l.Name
	record := func(kind string, args ...string) {
		t.Helper()
		undo, err := l.Record(kind, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := undo(); err != nil {
				t.Errorf("undo %s %v: %v", kind, args, err)
			}
		})
	}
	const fwd = "/proc/sys/net/ipv4/ip_forward"
	old, err := os.ReadFile(fwd)
	if err != nil {
		t.Fatal(err)
	}
	if v := strings.TrimSpace(string(old)); v != "1" {
		record(netlab.RecSysctl, fwd, v)
		if err := os.WriteFile(fwd, []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// iptables-nft leaves the nat table and its base chains behind.
	had, err := netlab.NFTableExists("ip", "nat")
	if err != nil {
		t.Fatal(err)
	}
	if !had {
		record(netlab.RecNFTable, "ip", "nat")
	}
	record(netlab.RecNFChain, "ip", "nat", chain)
	ipt := func(args ...string) { nsExec(t, "", "iptables", append([]string{"-w", "-t", "nat"}, args...)...) }
	ipt("-N", chain)
	ipt("-A", chain, "-d", vip.String()+"/32", "-p", "tcp", "--dport", "80", "-j", "DNAT", "--to-destination", to)
	ipt("-I", "PREROUTING", "-i", l.Bridge, "-j", chain)
}

// noRedirects makes a pod ignore ICMP redirects: the host forwards between
// two ports of one bridge, and a redirect accepted by a pod would send it
// around the host's conntrack.
func noRedirects(t *testing.T, p *netlab.Pod) {
	t.Helper()
	for _, k := range []string{"all", "default", "eth0"} {
		if err := p.Sysctl("net.ipv4.conf."+k+".accept_redirects", "0"); err != nil {
			t.Fatal(err)
		}
	}
}

// runStreamCase runs c against addr from p (plain, then the caller checks
// counters) and fails with the client's output on any byte mismatch.
func (e *env) runStreamCase(t *testing.T, p *netlab.Pod, c streamCase, addr string, seed int, extra ...string) {
	t.Helper()
	if out, err := e.run(p, append(c.args(addr, seed), extra...)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}

// TestDNAT covers ClusterIP-style DNAT: (a) in the client pod's own netns,
// which the egress program learns exactly; (b) kube-proxy's, in the host
// netns, which the host's NAT learner (bpf/shortcut/nat.h: the fentry on
// __nf_conntrack_confirm where it loads, else the close reset's tc program
// at the server's SYN-ACK, else the netfilter link at POST_ROUTING) learns
// from the host's conntrack; (c) one source ip:port to
// two destinations at once, with and without NAT.
func TestDNAT(t *testing.T) { dnat(t) }

// TestDNATSynAck is TestDNAT with the fentry refused, as on hosts that
// refuse tracing programs on functions (this project's own machine kind):
// the close reset's tc program learns the host's DNAT at the server's
// SYN-ACK, from conntrack (no NAT hook).
func TestDNATSynAck(t *testing.T) {
	t.Setenv(bpfsys.TestRefuseEnv, "ez_sc_nat_ct")
	dnat(t)
}

// TestDNATNetfilter is TestDNAT with the fentry and the SYN-ACK learning
// refused, as on hosts that refuse tracing programs on functions and have
// no conntrack kfuncs: ez_sc_nat (netfilter link) learns the host's DNAT
// (ez_sc_nat_dev before Linux 6.4).
func TestDNATNetfilter(t *testing.T) {
	t.Setenv(bpfsys.TestRefuseEnv, "ez_sc_nat_ct,ez_sc_nat_tc")
	dnat(t)
}

// TestDNATDevQueue is TestDNAT with the fentry, the SYN-ACK learning and
// ez_sc_nat refused, as on kernels without BPF netfilter links (before 6.4)
// that refuse the fentry: ez_sc_nat_dev learns the host's DNAT at
// tp_btf/net_dev_queue.
func TestDNATDevQueue(t *testing.T) {
	t.Setenv(bpfsys.TestRefuseEnv, "ez_sc_nat_ct,ez_sc_nat_tc,ez_sc_nat")
	dnat(t)
}

func dnat(t *testing.T) {
	e := newEnv(t, "dnat", 15)
	a := e.pod("a", true) // client
	b := e.pod("b", true) // server behind the pod-local VIP
	k := e.pod("k", true) // server behind the host's VIP
	e.serve(b, "--stream", ":7000")
	e.serve(k, "--stream", ":7000")
	for _, p := range []*netlab.Pod{a, b, k} {
		noRedirects(t, p)
	}
	podDNAT(t, a, podVIP, hostport(b.IPv4, 7000))
	hostDNAT(t, e.lab, hostVIP, hostport(k.IPv4, 7000))
	// k answers A through the host, whose conntrack undoes the DNAT on the
	// replies. (With br_netfilter's bridge-nf-call-iptables=1 k's direct
	// replies would be un-NATed on the bridge too; the route makes the test
	// independent of that host setting.)
	nsExec(t, k.NetNS, "ip", "route", "add", a.IPv4.String()+"/32", "via", e.lab.GatewayV4.String())

	c := streamCase{conns: 20, parallel: 20, up: 1 << 20, down: 1 << 20, chunk: 16 << 10}
	n := uint64(c.conns)
	type natCase struct {
		name  string
		addr  string
		check func(t *testing.T, d map[string]uint64)
	}
	cases := []natCase{
		{"a-pod-output-dnat", hostport(podVIP, 80), func(t *testing.T, d map[string]uint64) {
			if d["pairs"]+d["fallback_early_data"] != n {
				t.Errorf("DNAT in the client's netns: pairs %d + early-data %d != %d connections", d["pairs"], d["fallback_early_data"], n)
			}
			if d["pairs"] == 0 || d["bytes_redirected"] == 0 {
				t.Errorf("nothing was accelerated: %v", d)
			}
		}},
		{"b-host-prerouting-dnat", hostport(hostVIP, 80), func(t *testing.T, d map[string]uint64) {
			// The client knows A:p -> VIP:80, the listener A:p -> k:7000;
			// only the host's conntrack knows both: the host's NAT learner
			// writes the alias the client follows.
			if d["pairs"]+d["fallback_early_data"] != n || d["pairs"] == 0 {
				t.Errorf("host DNAT: pairs %d + early-data %d != %d connections: %v", d["pairs"], d["fallback_early_data"], n, d)
			}
			if d["nat_aliases"] < n {
				t.Errorf("host DNAT: %d aliases learnt, want %d", d["nat_aliases"], n)
			}
		}},
	}
	// (c) One source ip:port, two destinations at once. Each client sends its
	// own seeds, so bytes delivered to the other connection's server fail
	// verification. port is the bound port, fresh per run (the servers keep
	// TIME_WAIT).
	type leg struct {
		addr string
		// mustPair: every leg must pair, whether NAT-ed in the client's
		// netns (egress program) or in the host (ez_sc_nat).
		mustPair bool
	}
	shared := []struct {
		name  string
		legs  [2]leg
		note  string
		remap bool // A's conntrack must have moved one source port
	}{
		{"direct-b+direct-k", [2]leg{{hostport(b.IPv4, 7000), true}, {hostport(k.IPv4, 7000), true}},
			"plain connections", false},
		{"direct-b+podvip-b", [2]leg{{hostport(b.IPv4, 7000), true}, {hostport(podVIP, 80), true}},
			"same post-NAT 4-tuple twice: A's conntrack moves one source port, the egress program learns it", true},
		{"podvip-b+hostvip-k", [2]leg{{hostport(podVIP, 80), true}, {hostport(hostVIP, 80), true}},
			"one NAT learnt in A, one in the host", false},
		{"direct-b+hostvip-k", [2]leg{{hostport(b.IPv4, 7000), true}, {hostport(hostVIP, 80), true}},
			"a keyed-by-source shortcut would confuse these two", false},
	}
	big := streamCase{conns: 1, parallel: 1, up: 16 << 20, down: 16 << 20, chunk: 4096}
	port := 21000 // client ports below the ephemeral range (32768-60999): never taken by a TIME_WAIT socket
	for _, accel := range []bool{false, true} {
		if accel {
			e.accelerate()
			// The best learner this host has that nothing refuses.
			st, _ := e.dp.Parts().Get(parts.ShortcutNAT)
			if !st.Runs {
				t.Fatalf("shortcut-nat %+v, want it running", st)
			}
			if name, _ := natLearner(t, st, e.cfg.Dir()); name != wantNATLearner(os.Getenv(bpfsys.TestRefuseEnv)) {
				t.Fatalf("shortcut-nat %+v, want it learning by %s", st, wantNATLearner(os.Getenv(bpfsys.TestRefuseEnv)))
			}
			t.Logf("shortcut-nat via %s", st.Via)
		}
		for i, nc := range cases {
			t.Run(fmt.Sprintf("accel=%v/%s", accel, nc.name), func(t *testing.T) {
				var before map[string]uint64
				if accel {
					before = e.counters()
				}
				e.runStreamCase(t, a, c, nc.addr, 1000*(i+1))
				if !accel {
					return
				}
				d := delta(before, e.counters())
				t.Logf("counters: %v", d)
				if d["handshakes"] != n {
					t.Errorf("handshakes %d, want %d", d["handshakes"], n)
				}
				if d["fallback_ambiguous"] != 0 {
					t.Errorf("fallback_ambiguous %d", d["fallback_ambiguous"])
				}
				nc.check(t, d)
			})
		}
		for i, sc := range shared {
			port++
			bind := hostport(a.IPv4, port)
			t.Run(fmt.Sprintf("accel=%v-shared-source/%s", accel, sc.name), func(t *testing.T) {
				var before map[string]uint64
				if accel {
					before = e.counters()
				}
				var wg sync.WaitGroup
				errs := make([]error, 2)
				outs := make([]string, 2)
				for j, l := range sc.legs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						args := append(big.args(l.addr, 100000+1000*i+100*j), "--bind", bind)
						outs[j], errs[j] = e.run(a, args...)
					}()
				}
				wg.Wait()
				for j := range errs {
					if errs[j] != nil {
						t.Errorf("%s from %s (%s): %v\n%s", sc.legs[j].addr, bind, sc.note, errs[j], outs[j])
					}
				}
				moved := conntrackMovedPorts(t, a, port)
				if sc.remap && len(moved) == 0 {
					t.Errorf("A's conntrack kept source port %d for both connections; the case needs a moved port", port)
				}
				if len(moved) > 0 {
					t.Logf("A's conntrack moved source port %d to %v on the wire", port, moved)
				}
				if !accel {
					return
				}
				d := delta(before, e.counters())
				t.Logf("%s: counters: %v", sc.note, d)
				want := uint64(0)
				for _, l := range sc.legs {
					if l.mustPair {
						want++
					}
				}
				if got := d["pairs"] + d["fallback_early_data"]; got < want || got > 2 {
					t.Errorf("pairs %d + early-data %d, want %d..2", d["pairs"], d["fallback_early_data"], want)
				}
				if d["handshakes"] != 2 {
					t.Errorf("handshakes %d, want 2", d["handshakes"])
				}
				if d["fallback_ambiguous"] != 0 {
					t.Errorf("fallback_ambiguous %d", d["fallback_ambiguous"])
				}
			})
		}
	}
}

// conntrackMovedPorts returns, for the TCP connections of p's netns whose
// original source port is port, the reply destination ports that differ
// from it: source ports NAT moved on the wire.
func conntrackMovedPorts(t *testing.T, p *netlab.Pod, port int) []string {
	t.Helper()
	h, err := p.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatalf("conntrack in %s: %v", p.NetNS, err)
	}
	var moved []string
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_TCP && int(f.Forward.SrcPort) == port && int(f.Reverse.DstPort) != port {
			moved = append(moved, strconv.Itoa(int(f.Reverse.DstPort)))
		}
	}
	return moved
}
