package services

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
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

// pinV1 replaces the frontend and NodePort maps pinned in fam by maps of
// the values builds before inline backends had, with the same entries.
func pinV1(t *testing.T, fam string) {
	t.Helper()
	for _, name := range []string{servicesMapEzSvcFrontends, servicesMapEzSvcNodeports} {
		pin := filepath.Join(fam, name)
		cur, err := ebpf.LoadPinnedMap(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		size := uint32(12)
		if name == servicesMapEzSvcNodeports {
			size = 16
		}
		old, err := ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.Hash, KeySize: cur.KeySize(), ValueSize: size,
			MaxEntries: cur.MaxEntries(), Flags: cur.Flags()})
		if err != nil {
			t.Fatal(err)
		}
		key := make([]byte, cur.KeySize())
		val := make([]byte, cur.ValueSize())
		for it := cur.Iterate(); it.Next(&key, &val); {
			v1 := val[:12]
			if size == 16 { // ez_svc_np: svc, then flags
				v1 = append(slices.Clone(val[:12]), val[len(val)-4:]...)
			}
			if err := old.Put(key, v1); err != nil {
				t.Fatal(err)
			}
		}
		cur.Close()
		if err := os.Remove(pin); err != nil {
			t.Fatal(err)
		}
		if err := old.Pin(pin); err != nil {
			t.Fatal(err)
		}
		old.Close()
	}
}

// valueSize is the value size of the map pinned at fam/name.
func valueSize(t *testing.T, fam, name string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(fam, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return m.ValueSize()
}

// TestMigrateInlineBackends: frontend and NodePort maps an earlier build
// pinned without inline backends are rewritten before this build loads
// over them (an upgrade in place): every frontend kept, those of one and
// two backends carrying them; a rolled back install pins the old maps back.
func TestMigrateInlineBackends(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (BPF maps)")
	}
	bpffs, err := os.MkdirTemp("/sys/fs/bpf", "eztunnel-inline-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bpffs) })
	cfg := Config{MaxFrontends: 16, MaxBackends: 16, MaxSlots: 32, PinDir: bpffs}
	l, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	be := func(n int) []Backend {
		var out []Backend
		for i := range n {
			out = append(out, netip.MustParseAddrPort(fmt.Sprintf("10.9.0.%d:80", i+1)))
		}
		return out
	}
	var fs []Frontend
	for n := range 4 {
		f := Frontend{Addr: netip.MustParseAddr(fmt.Sprintf("10.96.0.%d", n+1)), Port: 80, Proto: UDP}
		np := Frontend{NodePort: true, Addr: netip.IPv4Unspecified(), Port: uint16(30000 + n), Proto: TCP}
		for _, fr := range []Frontend{f, np} {
			if err := l.SetFrontend(fr, Target{Backends: be(n)}); err != nil {
				t.Fatal(err)
			}
		}
		fs = append(fs, f)
	}
	l.Close()
	fam := mapDir(bpffs)
	pinV1(t, fam)

	tx := &bpfsys.Tx{}
	if err := Migrate(tx, bpffs); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if got := valueSize(t, fam, servicesMapEzSvcFrontends); got != 12 {
		t.Fatalf("after a rollback the frontends have values of %d bytes, want the earlier 12", got)
	}
	if _, err := os.Stat(filepath.Join(fam, servicesMapEzSvcFrontends+"_v1")); !os.IsNotExist(err) {
		t.Fatalf("rollback left the _v1 pin: %v", err)
	}
	if _, err := Load(cfg); err == nil {
		t.Fatal("this build loaded over the earlier values without a migration")
	}

	if err := bpfsys.RunTx(func(tx *bpfsys.Tx) error { return Migrate(tx, bpffs) }); err != nil {
		t.Fatal(err)
	}
	l, err = Load(cfg)
	if err != nil {
		t.Fatalf("load after the migration: %v", err)
	}
	defer l.Close()
	if n := l.Frontends(); n != 8 {
		t.Errorf("%d frontends restored, want 8", n)
	}
	for n, f := range fs {
		if got := slotsOf(t, l, f); len(got) != n { // slotsOf checks the inline backends
			t.Errorf("%s: backends %v, want %d", f, got, n)
		}
	}
	for n := range 4 {
		var v servicesEzSvcNp
		k, err := nodePortKey(Frontend{NodePort: true, Addr: netip.IPv4Unspecified(), Port: uint16(30000 + n), Proto: TCP})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.objs.EzSvcNodeports.Lookup(k, &v); err != nil {
			t.Fatal(err)
		}
		if int(v.Svc.Count) != n || (n > 0 && n <= 2 && v.Svc.Be[n-1].Port != 80) {
			t.Errorf("NodePort %d after the migration: %+v", 30000+n, v)
		}
	}
	if _, err := os.Stat(filepath.Join(fam, servicesMapEzSvcNodeports+"_v1")); !os.IsNotExist(err) {
		t.Fatalf("commit left the _v1 pin: %v", err)
	}
}
