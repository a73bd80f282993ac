package services

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
)

// TestLoadOverFewerCounters: a build with more counters loads over the
// counters an older build pinned with fewer (an upgrade in place), and
// keeps their values.
func TestLoadOverFewerCounters(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (BPF maps)")
	}
	bpffs, err := os.MkdirTemp("/sys/fs/bpf", "eztunnel-counters-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bpffs) })
	if err := os.MkdirAll(mapDir(bpffs), 0o700); err != nil {
		t.Fatal(err)
	}
	want := uint32(servicesEzSvcCounterEZ_SVC_C_MAX)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "ez_svc_counters", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: want - 1})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]uint64, cpus)
	for i := range vals {
		vals[i] = uint64(i + 1)
	}
	if err := old.Put(uint32(0), vals); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(mapDir(bpffs), "ez_svc_counters")); err != nil {
		t.Fatal(err)
	}
	lb, err := Load(Config{MaxFrontends: 8, MaxBackends: 8, MaxSlots: 16, PinDir: bpffs})
	if err != nil {
		t.Fatalf("load over %d pinned counters (this build has %d): %v", want-1, want, err)
	}
	defer lb.Close()
	if n := lb.objs.EzSvcCounters.MaxEntries(); n != want {
		t.Fatalf("counters map has %d entries, want %d", n, want)
	}
	var got []uint64
	if err := lb.objs.EzSvcCounters.Lookup(uint32(0), &got); err != nil {
		t.Fatal(err)
	}
	for i := range vals {
		if got[i] != vals[i] {
			t.Fatalf("counter 0 per CPU %v after the upgrade, was %v", got, vals)
		}
	}
	pinned, err := ebpf.LoadPinnedMap(filepath.Join(mapDir(bpffs), "ez_svc_counters"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Close()
	if pinned.MaxEntries() != want {
		t.Fatalf("pinned counters have %d entries, want %d", pinned.MaxEntries(), want)
	}
	if _, err := os.Stat(filepath.Join(mapDir(bpffs), "ez_svc_counters_grow")); !os.IsNotExist(err) {
		t.Fatalf("temporary pin left: %v", err)
	}
}
