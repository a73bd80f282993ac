package e2e

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// natLearners are the NAT learners' programs by the prefix of the
// shortcut-nat part's Via (bpf/shortcut/nat.h), best first.
var natLearners = []struct{ via, prog string }{
	{"fentry/__nf_conntrack_confirm", "ez_sc_nat_ct"},
	{"ez_sc_close_reset's tc links", "ez_sc_close_reset"},
	{"netfilter link", "ez_sc_nat"},
	{"tp_btf/net_dev_queue", "ez_sc_nat_dev"},
}

// natLearner is the program the part's Via names, and its link pins under
// dir (netfilter: one per family).
func natLearner(t *testing.T, st parts.Status, dir string) (prog string, pins []string) {
	t.Helper()
	for _, l := range natLearners {
		if !strings.HasPrefix(st.Via, l.via) {
			continue
		}
		if l.prog == "ez_sc_close_reset" {
			return l.prog, nil // no link of its own: the close reset's (closereset_test.go)
		}
		if l.prog == "ez_sc_nat" {
			return l.prog, []string{bpfsys.LinkPin(dir, bpfsys.KindNetfilter, "ez_sc_nat_ipv4"), bpfsys.LinkPin(dir, bpfsys.KindNetfilter, "ez_sc_nat_ipv6")}
		}
		return l.prog, []string{bpfsys.LinkPin(dir, bpfsys.KindTracing, l.prog)}
	}
	t.Fatalf("shortcut-nat %+v: no NAT learner named", st)
	return "", nil
}

// wantNATLearner is the learner this host should use with refused (a
// TestRefuseEnv list) refused: the fentry where it loads, else the close
// reset's tc program where the conntrack kfuncs are there (ez_sc_nat_tc
// names it), else the netfilter link where the kernel has them, else
// net_dev_queue.
func wantNATLearner(refused string) string {
	no := func(p string) bool { return strings.Contains(","+refused+",", ","+p+",") }
	switch {
	case !no("ez_sc_nat_ct") && bpfsys.Fentry("__nf_conntrack_confirm")() == nil:
		return "ez_sc_nat_ct"
	case !no("ez_sc_nat_tc") && !no("ez_sc_close_reset") && conntrackKfuncs() == nil:
		return "ez_sc_close_reset"
	case !no("ez_sc_nat") && bpfsys.ProgType(ebpf.Netfilter)() == nil:
		return "ez_sc_nat"
	}
	return "ez_sc_nat_dev"
}

// conntrackKfuncs: the kernel has the conntrack kfuncs (nf_conntrack built
// in, or loaded: the lab's DNAT loads it).
func conntrackKfuncs() error {
	if bpfsys.KernelFunc("bpf_skb_ct_lookup")() == nil {
		return nil
	}
	spec, err := btf.LoadKernelModuleSpec("nf_conntrack")
	if err != nil {
		return err
	}
	var f *btf.Func
	return spec.TypeByName("bpf_skb_ct_lookup", &f)
}

// hostVIPPair is a client pod a and a server k behind the host's VIP
// (hostDNAT), k answering a through the host (dnat's route).
func hostVIPPair(t *testing.T, e *env, managed bool, mode string) (a, k *netlab.Pod) {
	t.Helper()
	a, k = e.pod("a", managed), e.pod("k", managed)
	for _, p := range []*netlab.Pod{a, k} {
		noRedirects(t, p)
	}
	hostDNAT(t, e.lab, hostVIP, hostport(k.IPv4, 7000))
	nsExec(t, k.NetNS, "ip", "route", "add", a.IPv4.String()+"/32", "via", e.lab.GatewayV4.String())
	e.serve(k, mode, ":7000")
	return a, k
}

// TestNATHookScope: where the kernel lets the agent attach fentry programs,
// the host's NAT is learnt once per new connection (conntrack's
// confirmation), not once per packet: 200 round trips of plain TCP through
// the host's VIP between pods outside the managed cgroups run the learner
// at most a few times (its connection, and whatever else the machine opened
// meanwhile). The netfilter link and net_dev_queue run for every packet:
// there the same round trips run the learner at least once each. Run
// counts come from BPF_ENABLE_STATS, which ends with its file descriptor.
func TestNATHookScope(t *testing.T) {
	e := newEnv(t, "nhs", 35)
	u, _ := hostVIPPair(t, e, false, "--echo")
	e.accelerate()
	st, _ := e.dp.Parts().Get(parts.ShortcutNAT)
	name, pins := natLearner(t, st, e.cfg.Dir())
	if want := wantNATLearner(os.Getenv(bpfsys.TestRefuseEnv)); name != want {
		t.Fatalf("shortcut-nat %+v, want %s", st, want)
	}
	if name == "ez_sc_close_reset" {
		// Its program runs for every packet of the pods' veths, for the
		// close reset: no NAT hook of its own runs (the pins are gone).
		for _, l := range natLearners {
			_, lpins := natLearner(t, parts.Status{Via: l.via}, e.cfg.Dir())
			for _, p := range lpins {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s is pinned (%v) while %s learns", p, err, name)
				}
			}
		}
		return
	}
	runs := linkRuns(t, pins[0])
	const trips = 200
	before := runs()
	if out, err := e.run(u, "workload", "pingpong", "--addr", hostport(hostVIP, 80), "--size", "64", "--n", "200", "--warmup", "1"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	n := runs() - before
	t.Logf("%s ran %d times during %d plain round trips through the host's VIP", name, n, trips)
	switch {
	case name == "ez_sc_nat_ct" && n > 10:
		t.Errorf("%s ran %d times for one connection: not once per connection", name, n)
	case name == "ez_sc_nat_ct" && n == 0:
		t.Errorf("%s never ran for a new DNAT-ed connection: nothing measured", name)
	case name != "ez_sc_nat_ct" && n < trips:
		t.Errorf("%s ran %d times for %d round trips through the host: fewer than one per packet, nothing measured", name, n, trips)
	}
}

// TestNATHookChange: an agent that learns the host's NAT on one hook hands
// over to one that learns it on another. The first has the fentry and the
// netfilter link refused, so it learns at tp_btf/net_dev_queue; the second
// uses the best this host has (the fentry where it loads: an upgrade to
// this build). After the handover, connections through the host's VIP pair
// on aliases the new learner wrote, and exactly its links stay pinned.
// Where the host has only net_dev_queue, both use it, and the test checks
// that handover instead.
func TestNATHookChange(t *testing.T) {
	e := newEnv(t, "nhc", 36)
	a, _ := hostVIPPair(t, e, true, "--stream")
	pin := e.cfg.PinRoot
	dir := e.cfg.Dir()
	t.Cleanup(func() { eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
	t.Setenv(bpfsys.TestRefuseEnv, "ez_sc_nat_ct,ez_sc_nat_tc,ez_sc_nat")
	old := startAgent(t, bin, e.lab.Managed, pin)
	if name, _ := natLearner(t, partOf(t, statusParts(t, pin).Parts, parts.ShortcutNAT), dir); name != "ez_sc_nat_dev" {
		t.Fatalf("the first agent learns NAT by %s, want ez_sc_nat_dev", name)
	}
	t.Setenv(bpfsys.TestRefuseEnv, "")
	startAgent(t, bin, e.lab.Managed, pin, "--takeover")
	old.kill(t)

	st := partOf(t, statusParts(t, pin).Parts, parts.ShortcutNAT)
	name, _ := natLearner(t, st, dir)
	if want := wantNATLearner(""); name != want {
		t.Fatalf("the new agent learns NAT by %+v, want %s", st, want)
	}
	if name == "ez_sc_nat_dev" {
		t.Log("this host has only net_dev_queue: the handover is between two of its links")
	}
	c0 := pinnedCounters(t, pin)
	const conns = 10
	e.runStreamCase(t, a, streamCase{conns: conns, parallel: conns, up: 1 << 20, down: 1 << 20, chunk: 16 << 10}, hostport(hostVIP, 80), 77)
	d := delta(c0, pinnedCounters(t, pin))
	t.Logf("after the handover, by %s: %v", name, d)
	if d["nat_aliases"] < conns {
		t.Errorf("%d aliases learnt for %d connections through the host's VIP", d["nat_aliases"], conns)
	}
	if d["pairs"]+d["fallback_early_data"] != conns || d["pairs"] == 0 {
		t.Errorf("pairs %d + early-data %d != %d connections: %v", d["pairs"], d["fallback_early_data"], conns, d)
	}
	for _, l := range natLearners {
		_, lpins := natLearner(t, parts.Status{Via: l.via}, dir)
		for _, p := range lpins {
			_, err := os.Stat(p)
			switch {
			case l.prog == name && err != nil:
				t.Errorf("the new learner's link %s is not pinned: %v", p, err)
			case l.prog != name && !errors.Is(err, os.ErrNotExist):
				t.Errorf("%s is still pinned after the handover (%v)", p, err)
			}
		}
	}
}
