package services

import (
	"net/netip"
	"testing"
	"time"
)

// slotsOf reads f's count and slots back from the kernel's maps.
func slotsOf(t *testing.T, lb *LB, f Frontend) []Backend {
	t.Helper()
	key, err := frontendKey(f)
	if err != nil {
		t.Fatal(err)
	}
	var svc servicesEzSvc
	if err := lb.objs.EzSvcFrontends.Lookup(key, &svc); err != nil {
		t.Fatalf("frontend %s: %v", f, err)
	}
	var out []Backend
	for i := uint32(0); i < svc.Count; i++ {
		var id uint32
		if err := lb.objs.EzSvcSlots.Lookup(servicesEzSvcSlotKey{Id: svc.Id, Slot: i}, &id); err != nil {
			t.Fatalf("frontend %s slot %d: %v", f, i, err)
		}
		var be servicesEzSvcBackend
		if err := lb.objs.EzSvcBackends.Lookup(id, &be); err != nil {
			t.Fatalf("frontend %s slot %d backend %d: %v", f, i, id, err)
		}
		var m uint32
		if err := lb.objs.EzSvcMembers.Lookup(servicesEzSvcMemberKey{Id: svc.Id, Backend: id}, &m); err != nil {
			t.Fatalf("frontend %s backend %d not a member: %v", f, id, err)
		}
		out = append(out, netip.AddrPortFrom(netip.AddrFrom16(be.Addr).Unmap(), be.Port))
		// A frontend of few backends carries them: the same, in slot order.
		if svc.Count <= uint32(len(svc.Ids)) && (svc.Ids[i] != id || svc.Be[i] != be) {
			t.Fatalf("frontend %s slot %d: inline backend %d %v, slots say %d %v", f, i, svc.Ids[i], svc.Be[i], id, be)
		}
	}
	return out
}

func count(t *testing.T, lb *LB) (fe, slots, members, backends int) {
	t.Helper()
	it := lb.objs.EzSvcFrontends.Iterate()
	var k servicesEzSvcKey
	var v servicesEzSvc
	for it.Next(&k, &v) {
		fe++
	}
	it2 := lb.objs.EzSvcSlots.Iterate()
	var sk servicesEzSvcSlotKey
	var id uint32
	for it2.Next(&sk, &id) {
		slots++
	}
	it3 := lb.objs.EzSvcMembers.Iterate()
	var mk servicesEzSvcMemberKey
	for it3.Next(&mk, &id) {
		members++
	}
	it4 := lb.objs.EzSvcBackends.Iterate()
	var be servicesEzSvcBackend
	for it4.Next(&id, &be) {
		backends++
	}
	return
}

// TestSetFrontendIncremental: kept backends keep their slots, removals move
// the last slot into the hole, shared backends are written once, and
// deleting every frontend leaves every map empty.
func TestSetFrontendIncremental(t *testing.T) {
	lb, err := Load(Config{MaxFrontends: 8, MaxBackends: 8, MaxSlots: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	be := func(s string) Backend { return netip.MustParseAddrPort(s) }
	f := Frontend{Addr: netip.MustParseAddr("10.96.1.1"), Port: 80, Proto: TCP}
	g := Frontend{Addr: netip.MustParseAddr("fd00::1"), Port: 53, Proto: UDP}
	a, b, c := be("10.0.0.1:8080"), be("10.0.0.2:8080"), be("10.0.0.3:8080")
	if err := lb.SetFrontend(f, Target{Backends: []Backend{a, b, c, a}}); err != nil {
		t.Fatal(err)
	}
	if got := slotsOf(t, lb, f); len(got) != 3 || got[0] != a || got[1] != b || got[2] != c {
		t.Fatalf("slots %v", got)
	}
	if err := lb.SetFrontend(f, Target{Backends: []Backend{a, c}}); err != nil {
		t.Fatal(err)
	}
	if got := slotsOf(t, lb, f); len(got) != 2 || got[0] != a || got[1] != c {
		t.Fatalf("after removing %s: slots %v", b, got)
	}
	if err := lb.SetFrontend(g, Target{Backends: nil}); err != nil {
		t.Fatal(err)
	}
	if got := slotsOf(t, lb, g); len(got) != 0 {
		t.Fatalf("no backends: slots %v", got)
	}
	if err := lb.SetFrontend(g, Target{Backends: []Backend{be("[fd00::2]:53")}}); err != nil {
		t.Fatal(err)
	}
	if err := lb.SetFrontend(g, Target{Backends: []Backend{a}}); err == nil {
		t.Error("IPv4 backend for an IPv6 frontend accepted")
	}
	if err := lb.SetFrontend(Frontend{Addr: netip.MustParseAddr("10.96.1.2"), Port: 80, Proto: 1}, Target{Backends: nil}); err == nil {
		t.Error("protocol 1 accepted")
	}
	h := Frontend{Addr: netip.MustParseAddr("10.96.1.2"), Port: 80, Proto: TCP}
	if err := lb.SetFrontend(h, Target{Backends: []Backend{a}, Affinity: 1500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := lb.SetFrontend(h, Target{Backends: []Backend{a}, Affinity: 2 * MaxAffinity}); err == nil {
		t.Error("affinity beyond the API's maximum accepted")
	}
	hk, _ := frontendKey(h)
	var hv servicesEzSvc
	if err := lb.objs.EzSvcFrontends.Lookup(hk, &hv); err != nil || hv.Affinity != 2 {
		t.Errorf("affinity 1.5 s written as %d s (%v), want 2", hv.Affinity, err)
	}
	if fe, slots, members, backends := count(t, lb); fe != 3 || slots != 4 || members != 4 || backends != 3 {
		t.Errorf("frontends %d slots %d members %d backends %d, want 3 4 4 3", fe, slots, members, backends)
	}
	for _, x := range []Frontend{f, g, h} {
		if err := lb.DeleteFrontend(x); err != nil {
			t.Fatal(err)
		}
	}
	if fe, slots, members, backends := count(t, lb); fe+slots+members+backends != 0 {
		t.Errorf("after deleting all: frontends %d slots %d members %d backends %d", fe, slots, members, backends)
	}
}
