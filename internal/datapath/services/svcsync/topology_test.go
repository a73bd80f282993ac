package svcsync

import (
	"net/netip"
	"slices"
	"testing"

	"k8s.io/utils/ptr"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// TestCategorize runs the cases of kube-proxy's own TestCategorizeEndpoints
// (pkg/proxy/topology_test.go, v1.33.13) against categorize: its Cluster
// and Local endpoint lists, with the feature gate PreferSameTrafficDistribution
// off (its default in v1.33), so node hints are not used.
func TestCategorize(t *testing.T) {
	type e = endpoint
	r := func(a string, zones ...string) e {
		return e{be: netip.MustParseAddrPort(a), ready: true, serving: true, zones: zones}
	}
	rl := func(a string, zones ...string) e { x := r(a, zones...); x.local = true; return x }
	unready := func(a string, zones ...string) e { return e{be: netip.MustParseAddrPort(a), zones: zones} }
	term := func(a string, local bool) e {
		return e{be: netip.MustParseAddrPort(a), serving: true, terminating: true, local: local}
	}
	cases := []struct {
		name           string
		zone           string
		eps            []e
		cluster, local []string
	}{
		{"all hinted, endpoints for the zone", "zone-a",
			[]e{r("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"), r("10.1.2.5:80", "zone-c"), r("10.1.2.6:80", "zone-a")},
			[]string{"10.1.2.3:80", "10.1.2.6:80"}, nil},
		{"Local endpoints ignore topology", "zone-a",
			[]e{rl("10.1.2.3:80", "zone-a"), rl("10.1.2.4:80", "zone-b"), r("10.1.2.5:80", "zone-c"), r("10.1.2.6:80", "zone-a")},
			[]string{"10.1.2.3:80", "10.1.2.6:80"}, []string{"10.1.2.3:80", "10.1.2.4:80"}},
		{"no zone label", "", []e{r("10.1.2.3:80", "zone-a")}, []string{"10.1.2.3:80"}, nil},
		{"node in another zone: no filtering", "zone-b", []e{r("10.1.2.3:80", "zone-a")}, []string{"10.1.2.3:80"}, nil},
		{"unready endpoint", "zone-a",
			[]e{r("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"), r("10.1.2.5:80", "zone-c"), unready("10.1.2.6:80", "zone-a")},
			[]string{"10.1.2.3:80"}, nil},
		{"only unready endpoints in the zone: no filtering", "zone-a",
			[]e{unready("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"), r("10.1.2.5:80", "zone-c"), unready("10.1.2.6:80", "zone-a")},
			[]string{"10.1.2.4:80", "10.1.2.5:80"}, nil},
		{"a hint missing: no filtering", "zone-a",
			[]e{r("10.1.2.3:80", "zone-a"), r("10.1.2.4:80", "zone-b"), r("10.1.2.5:80"), r("10.1.2.6:80", "zone-a")},
			[]string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80", "10.1.2.6:80"}, nil},
		{"several hints per endpoint", "zone-c",
			[]e{r("10.1.2.3:80", "zone-a", "zone-b", "zone-c"), r("10.1.2.4:80", "zone-b", "zone-c"), r("10.1.2.5:80", "zone-b", "zone-d"), r("10.1.2.6:80", "zone-c")},
			[]string{"10.1.2.3:80", "10.1.2.4:80", "10.1.2.6:80"}, nil},
		{"topology and localness conflict", "zone-a",
			[]e{rl("10.0.0.0:80", "zone-a"), rl("10.0.0.1:80", "zone-b"), r("10.0.0.2:80", "zone-a"), r("10.0.0.3:80", "zone-b")},
			[]string{"10.0.0.0:80", "10.0.0.2:80"}, []string{"10.0.0.0:80", "10.0.0.1:80"}},
		{"no endpoints", "", nil, nil, nil},
		{"all remote", "", []e{r("10.0.0.0:80"), r("10.0.0.1:80")}, []string{"10.0.0.0:80", "10.0.0.1:80"}, nil},
		{"all local", "", []e{rl("10.0.0.0:80"), rl("10.0.0.1:80")}, []string{"10.0.0.0:80", "10.0.0.1:80"}, []string{"10.0.0.0:80", "10.0.0.1:80"}},
		{"some local", "", []e{rl("10.0.0.0:80"), r("10.0.0.1:80")}, []string{"10.0.0.0:80", "10.0.0.1:80"}, []string{"10.0.0.0:80"}},
		{"none ready", "", []e{unready("10.0.0.0:80"), unready("10.0.0.1:80")}, nil, nil},
		{"some ready", "", []e{unready("10.0.0.0:80"), r("10.0.0.1:80")}, []string{"10.0.0.1:80"}, nil},
		{"all terminating", "", []e{term("10.0.0.0:80", true), term("10.0.0.1:80", false)},
			[]string{"10.0.0.0:80", "10.0.0.1:80"}, []string{"10.0.0.0:80"}},
		{"all remote and terminating", "", []e{term("10.0.0.0:80", false), term("10.0.0.1:80", false)},
			[]string{"10.0.0.0:80", "10.0.0.1:80"}, nil},
		{"Local with terminating endpoints", "", []e{r("10.0.0.0:80"), {be: netip.MustParseAddrPort("10.0.0.1:80"), local: true},
			term("10.0.0.2:80", true), term("10.0.0.3:80", false)},
			[]string{"10.0.0.0:80"}, []string{"10.0.0.2:80"}},
	}
	for _, c := range cases {
		cluster, local := categorize(c.eps, c.zone)
		if !sameSet(cluster, c.cluster) || !sameSet(local, c.local) {
			t.Errorf("%s: cluster %v local %v; want %v, %v", c.name, cluster, local, c.cluster, c.local)
		}
	}
}

func sameSet(got []lb.Backend, want []string) bool {
	var g, w []string
	for _, b := range got {
		g = append(g, b.String())
	}
	w = append(w, want...)
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

// TestServiceEntriesPolicies: the ClusterIP takes the Local endpoints with
// internalTrafficPolicy Local and the zone's with hints; the NodePort takes
// Local with externalTrafficPolicy Local; what is not chosen stays listed
// (its TCP connections are not destroyed); one endpoint listed in two
// slices counts once, as local if either copy is.
func TestServiceEntriesPolicies(t *testing.T) {
	web := kubeapi.ServicePort{Name: "web", Port: 80, Protocol: kubeapi.ProtocolTCP, NodePort: 30080}
	s := svc("a", []string{"10.96.0.1"}, web)
	s.Spec.Type = kubeapi.ServiceTypeNodePort
	sl := slice("a", kubeapi.AddressTypeIPv4, "web", 8080, ep{addr: "10.0.0.1"}, ep{addr: "10.0.0.2"}, ep{addr: "10.0.0.3"})
	sl.Endpoints[0].NodeName = ptr.To("n1")
	sl.Endpoints[1].NodeName = ptr.To("n2")
	sl.Endpoints[2].NodeName = ptr.To("n2")
	for i, z := range []string{"z1", "z1", "z2"} {
		sl.Endpoints[i].Hints = &kubeapi.EndpointHints{ForZones: []kubeapi.ForZone{{Name: z}}}
	}
	dup := slice("a", kubeapi.AddressTypeIPv4, "web", 8080, ep{addr: "10.0.0.3"})
	dup.Name = "a-y"
	dup.Endpoints[0].Hints = sl.Endpoints[2].Hints
	dup.Endpoints[0].NodeName = ptr.To("n1") // the local copy wins
	cip := lb.Frontend{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: lb.TCP}
	np := lb.Frontend{Addr: netip.IPv4Unspecified(), Port: 30080, Proto: lb.TCP, NodePort: true}
	sls := []*kubeapi.EndpointSlice{sl, dup}
	check := func(what string, node Topology, cipWant, cipListed, npWant []string, keep bool) {
		t.Helper()
		e, _ := serviceEntries(s, sls, both, node)
		if !sameSet(e[cip].Backends, cipWant) || !sameSet(e[cip].Listed, cipListed) || !sameSet(e[np].Backends, npWant) || e[np].KeepSource != keep {
			t.Errorf("%s: ClusterIP %v listed %v, NodePort %v keep %v; want %v, %v, %v, %v", what,
				e[cip].Backends, e[cip].Listed, e[np].Backends, e[np].KeepSource, cipWant, cipListed, npWant, keep)
		}
	}
	all := []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}
	check("no zone", Topology{Name: "n1"}, all, nil, all, false)
	check("zone z1", Topology{Name: "n1", Zone: "z1"}, []string{"10.0.0.1:8080", "10.0.0.2:8080"}, []string{"10.0.0.3:8080"},
		[]string{"10.0.0.1:8080", "10.0.0.2:8080"}, false)
	s.Spec.ExternalTrafficPolicy = kubeapi.ServiceExternalTrafficPolicyLocal
	check("eTP Local", Topology{Name: "n1", Zone: "z1"}, []string{"10.0.0.1:8080", "10.0.0.2:8080"}, []string{"10.0.0.3:8080"},
		[]string{"10.0.0.1:8080", "10.0.0.3:8080"}, true)
	s.Spec.InternalTrafficPolicy = ptr.To(kubeapi.ServiceInternalTrafficPolicyLocal)
	check("iTP Local", Topology{Name: "n1", Zone: "z1"}, []string{"10.0.0.1:8080", "10.0.0.3:8080"}, []string{"10.0.0.2:8080"},
		[]string{"10.0.0.1:8080", "10.0.0.3:8080"}, true)
	// No local endpoint: the ClusterIP has none (connects refused; kube-proxy
	// drops them), the others stay listed.
	check("iTP Local on n3", Topology{Name: "n3"}, nil, all, nil, true)
}
