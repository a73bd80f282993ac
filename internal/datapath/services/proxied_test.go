package services

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
)

// proxiedEntries reads ez_svc_proxied and the span from the kernel's maps.
func proxiedEntries(t *testing.T, lb *LB) (map[uint64]servicesEzSvcProxy, servicesEzSvcProxySpan) {
	t.Helper()
	out := map[uint64]servicesEzSvcProxy{}
	var id uint64
	var v servicesEzSvcProxy
	it := lb.objs.EzSvcProxied.Iterate()
	for it.Next(&id, &v) {
		out[id] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	var sp servicesEzSvcProxySpan
	if err := lb.objs.EzSvcProxyLevels.Lookup(uint32(0), &sp); err != nil {
		t.Fatal(err)
	}
	return out, sp
}

// TestSetProxied converges the pods left to their proxy on the real maps:
// entries by cgroup id with the proxy's uid, the span of levels looked at
// (widened before writes, narrowed after deletes, zero with none), and a
// pinned set kept by the next Load until its first SetProxied.
func TestSetProxied(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (BPF maps, cgroups)")
	}
	root, err := cgroupv2.Root()
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp(root, "eztunnel-proxied-test-")
	if err != nil {
		t.Fatal(err)
	}
	a, c := filepath.Join(base, "a"), filepath.Join(base, "b", "c")
	for _, d := range []string{a, filepath.Dir(c), c} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{c, filepath.Dir(c), a, base} {
			os.Remove(d)
		}
	})
	level, err := cgroupLevel(a)
	if err != nil {
		t.Fatal(err)
	}
	idA, _ := cgroupv2.ID(a)
	idC, _ := cgroupv2.ID(c)
	bpffs, err := os.MkdirTemp("/sys/fs/bpf", "eztunnel-proxied-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bpffs) })
	lb, err := Load(Config{MaxFrontends: 8, MaxBackends: 8, MaxSlots: 16, PinDir: bpffs})
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.SetProxied([]Proxied{{Cgroup: a, UID: 1337, HasUID: true}, {Cgroup: c}}); err != nil {
		t.Fatal(err)
	}
	got, sp := proxiedEntries(t, lb)
	if len(got) != 2 || got[idA] != (servicesEzSvcProxy{Uid: 1337, Flags: uint32(servicesEzSvcProxyFlagEZ_SVC_PROXY_UID)}) ||
		got[idC] != (servicesEzSvcProxy{}) || sp != (servicesEzSvcProxySpan{Min: level, Max: level + 1}) {
		t.Fatalf("entries %v span %+v; want a (uid 1337) and c, levels %d..%d", got, sp, level, level+1)
	}
	if err := lb.SetProxied([]Proxied{{Cgroup: c}}); err != nil {
		t.Fatal(err)
	}
	if got, sp = proxiedEntries(t, lb); len(got) != 1 || sp != (servicesEzSvcProxySpan{Min: level + 1, Max: level + 1}) {
		t.Fatalf("after a left: entries %v span %+v", got, sp)
	}
	// A gone cgroup is reported, the others written.
	if err := lb.SetProxied([]Proxied{{Cgroup: c}, {Cgroup: filepath.Join(base, "gone")}}); err == nil {
		t.Error("a missing cgroup was not reported")
	}
	lb.Close()

	// The next agent keeps the pinned choice until its first SetProxied.
	lb, err = Load(Config{MaxFrontends: 8, MaxBackends: 8, MaxSlots: 16, PinDir: bpffs})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	if got, sp = proxiedEntries(t, lb); lb.ProxiedPods() != 1 || len(got) != 1 || sp.Max != level+1 {
		t.Fatalf("reloaded: %d pods, entries %v span %+v", lb.ProxiedPods(), got, sp)
	}
	if err := lb.SetProxied(nil); err != nil {
		t.Fatal(err)
	}
	if got, sp = proxiedEntries(t, lb); len(got) != 0 || sp != (servicesEzSvcProxySpan{}) {
		t.Fatalf("none: entries %v span %+v, want none and a zero span", got, sp)
	}
}
