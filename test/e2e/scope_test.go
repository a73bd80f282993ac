package e2e

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

func cgroupID(t *testing.T, path string) uint64 {
	t.Helper()
	id, err := cgroupv2.ID(path)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func scopeCounts(t *testing.T, pin string) map[uint64]uint64 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(pin, datapath.Schema, "ez_sc_cgroups"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	got, err := shortcut.ReadScope(m)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCgroupScope is Kubernetes mode's datapath without Kubernetes: the
// hooks attached once at the lab's root cgroup with the cgroup filter, pods
// selected by putting their cgroup (or an ancestor's) in ez_sc_cgroups. Only
// connections whose two ends are selected pair; every stream is byte-exact
// either way; deselecting a pod leaves its established connection on the
// shortcut to its end, and new connections on the kernel path.
func TestCgroupScope(t *testing.T) {
	e := newEnv(t, "scope", 31)
	a, b := e.pod("a", true), e.pod("b", true)
	c := e.pod("c", false) // in the lab's unmanaged subtree, under the same root
	e.serve(b, "--stream", ":7000")
	e.serve(c, "--stream", ":7000")
	e.cfg.CgroupFilter = true
	e.cfg.MaxUnread = 1 << 30 // keep the long transfer below on the shortcut (see bulkUnread)
	root := filepath.Dir(e.lab.Managed)
	dp, err := datapath.Install(e.cfg, []string{root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dp.Close()
		if err := datapath.Uninstall(e.cfg, 10*time.Second); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	pin := e.cfg.PinRoot
	small := streamCase{conns: 10, parallel: 10, up: 256 << 10, down: 256 << 10, chunk: 16384}
	streams := func(from, to string, wantPaired uint64, what string) datapath.Counters {
		t.Helper()
		src, dst := e.podByName(from), e.podByName(to)
		before := pinnedCounters(t, pin)
		if out, err := e.run(src, small.args(hostport(dst.IPv4, 7000), 5)...); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, out)
		}
		d := delta(before, pinnedCounters(t, pin))
		if wantPaired > 0 {
			requirePaired(t, d, wantPaired, 1, what)
		} else if d["pairs"] != 0 || d["fallback_excluded"]+d["fallback_no_local_peer"] == 0 {
			// A listener out of scope keeps no record: its selected
			// client finds no local peer.
			t.Errorf("%s: %d pairs, %d exclusions, %d without a local peer; want none paired and the fallbacks counted: %v",
				what, d["pairs"], d["fallback_excluded"], d["fallback_no_local_peer"], d)
		}
		return d
	}
	set := func(paths ...string) {
		t.Helper()
		var ids []uint64
		for _, p := range paths {
			ids = append(ids, cgroupID(t, p))
		}
		if _, _, err := dp.SetScope(ids); err != nil {
			t.Fatal(err)
		}
	}

	streams("a", "b", 0, "nothing selected")

	set(e.lab.Managed) // an ancestor of a's and b's cgroups
	streams("a", "b", 10, "a and b selected through their parent")
	streams("a", "c", 0, "client selected, server not")
	streams("c", "b", 0, "server selected, client not")

	set(a.Cgroup, b.Cgroup)
	streams("a", "b", 10, "a and b selected")
	counts := scopeCounts(t, pin)
	if len(counts) != 2 || counts[cgroupID(t, a.Cgroup)] < 10 || counts[cgroupID(t, b.Cgroup)] < 10 {
		t.Errorf("per-cgroup enrolments %v, want a and b with at least 10 each", counts)
	}
	out, err := eztunnelOut("status", "-o", "json", "--pin-path", pin)
	var rep struct {
		Maps map[string]datapath.MapFill `json:"maps"`
	}
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || rep.Maps["cgroups"].Entries != 2 {
		t.Errorf("status: %v, selected cgroups %+v, want 2 entries\n%s", err, rep.Maps["cgroups"], out)
	}

	// Deselect both in the middle of an accelerated transfer: it stays on
	// the shortcut, byte-exact (transferDuring checks both).
	e.transferDuring(pin, func() { set() })
	streams("a", "b", 0, "after deselecting")
	if n := len(scopeCounts(t, pin)); n != 0 {
		t.Errorf("%d cgroups still selected", n)
	}
}
