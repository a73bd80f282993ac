package podnet

import (
	"errors"
	"net/netip"
	"testing"
)

// TestWantedNeighbours: a pod address is wanted on the bridge its route
// leaves by, directly, when the bypass is attached to that bridge; routes
// by a gateway, other devices, link-local addresses and route errors are not.
func TestWantedNeighbours(t *testing.T) {
	a := netip.MustParseAddr
	routes := map[netip.Addr]struct {
		dev    int
		direct bool
	}{
		a("10.244.0.5"): {7, true},  // on bridge 7
		a("fd00::5"):    {7, true},  // on bridge 7
		a("10.244.0.6"): {9, true},  // bridge 9: the bypass is not attached there
		a("10.244.1.5"): {7, false}, // via a gateway
		a("10.244.2.5"): {3, true},  // another device
	}
	pods := []PodAddrs{
		{Namespace: "a", Name: "p1", IPs: []netip.Addr{a("10.244.0.5"), a("fd00::5")}},
		{Namespace: "a", Name: "p2", IPs: []netip.Addr{a("10.244.0.6"), a("fe80::1")}},
		{Namespace: "a", Name: "p3", IPs: []netip.Addr{a("10.244.1.5"), a("10.244.2.5"), a("10.244.3.5")}},
	}
	var logged []netip.Addr
	want := wantedNeighbours(pods, map[int]bool{7: true}, func(ip netip.Addr) (int, bool, error) {
		if ip.IsLinkLocalUnicast() {
			t.Errorf("route asked for link-local %s", ip)
		}
		r, ok := routes[ip]
		if !ok {
			return 0, false, errors.New("no route")
		}
		return r.dev, r.direct, nil
	}, func(ip netip.Addr, _ error) { logged = append(logged, ip) })
	if len(want) != 2 || want[a("10.244.0.5")] != 7 || want[a("fd00::5")] != 7 {
		t.Errorf("wanted %v", want)
	}
	if len(logged) != 1 || logged[0] != a("10.244.3.5") {
		t.Errorf("logged %v", logged)
	}
}
