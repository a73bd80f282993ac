package svcsync

import (
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

var both = Families{IPv4: true, IPv6: true}

func svc(name string, ips []string, ports ...kubeapi.ServicePort) *kubeapi.Service {
	return &kubeapi.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: kubeapi.ServiceSpec{Type: kubeapi.ServiceTypeClusterIP, ClusterIPs: ips, Ports: ports}}
}

type ep struct {
	addr                      string
	ready, serving, terminate *bool
}

func slice(name string, at kubeapi.AddressType, portName string, port int32, eps ...ep) *kubeapi.EndpointSlice {
	sl := &kubeapi.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-x",
		Labels: map[string]string{kubeapi.LabelServiceName: name}}, AddressType: at,
		Ports: []kubeapi.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(port), Protocol: ptr.To(kubeapi.ProtocolTCP)}}}
	for _, e := range eps {
		sl.Endpoints = append(sl.Endpoints, kubeapi.Endpoint{Addresses: []string{e.addr},
			Conditions: kubeapi.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminate}})
	}
	return sl
}

func aps(s ...string) []lb.Backend {
	var out []lb.Backend
	for _, x := range s {
		out = append(out, netip.MustParseAddrPort(x))
	}
	return out
}

func TestServiceEntriesReadiness(t *testing.T) {
	web := kubeapi.ServicePort{Name: "web", Port: 80, Protocol: kubeapi.ProtocolTCP}
	s := svc("a", []string{"10.96.0.1", "fd00::1"}, web)
	yes, no := ptr.To(true), ptr.To(false)
	sl4 := slice("a", kubeapi.AddressTypeIPv4, "web", 8080,
		ep{addr: "10.0.0.1"},                                          // nil conditions: ready
		ep{addr: "10.0.0.2", ready: yes},                              // ready
		ep{addr: "10.0.0.3", ready: no},                               // not ready, not terminating
		ep{addr: "10.0.0.4", ready: no, serving: yes, terminate: yes}) // serving terminating: only without ready ones
	sl6 := slice("a", kubeapi.AddressTypeIPv6, "web", 8080,
		ep{addr: "fd00::a", ready: no, serving: yes, terminate: yes},
		ep{addr: "fd00::b", ready: no, serving: no, terminate: yes})
	other := slice("a", kubeapi.AddressTypeIPv4, "other", 9090, ep{addr: "10.0.0.9"})
	e, skipped := serviceEntries(s, []*kubeapi.EndpointSlice{sl4, sl6, other}, both, Topology{})
	if len(skipped) != 0 {
		t.Errorf("skipped %v", skipped)
	}
	f4 := lb.Frontend{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: lb.TCP}
	f6 := lb.Frontend{Addr: netip.MustParseAddr("fd00::1"), Port: 80, Proto: lb.TCP}
	if got := sortedBackends(e[f4].Backends); !slices.Equal(got, aps("10.0.0.1:8080", "10.0.0.2:8080")) {
		t.Errorf("IPv4 backends %v", got)
	}
	if got := e[f6].Backends; !slices.Equal(got, aps("[fd00::a]:8080")) {
		t.Errorf("IPv6 backends (serving terminating only) %v", got)
	}
	if len(e) != 2 || e[f4].Affinity != 0 {
		t.Errorf("%d frontends, want 2: %v", len(e), e)
	}
	s.Spec.SessionAffinity = kubeapi.ServiceAffinityClientIP
	if e, _ := serviceEntries(s, nil, both, Topology{}); e[f4].Affinity != 10800*time.Second {
		t.Errorf("ClientIP affinity without config: %v, want the API default 3h", e[f4].Affinity)
	}
	s.Spec.SessionAffinityConfig = &kubeapi.SessionAffinityConfig{ClientIP: &kubeapi.ClientIPConfig{TimeoutSeconds: ptr.To[int32](30)}}
	if e, _ := serviceEntries(s, nil, both, Topology{}); e[f6].Affinity != 30*time.Second {
		t.Errorf("ClientIP affinity 30 s: %v", e[f6].Affinity)
	}
}

func TestServiceEntriesSkips(t *testing.T) {
	tcp := kubeapi.ServicePort{Port: 80, Protocol: kubeapi.ProtocolTCP}
	for _, c := range []struct {
		name    string
		svc     *kubeapi.Service
		fam     Families
		want    int
		skipped []string
	}{
		{"no ports", svc("a", []string{"10.96.0.1"}), both, 0, []string{SkipNoPorts}},
		{"sctp", svc("a", []string{"10.96.0.1"}, tcp, kubeapi.ServicePort{Name: "s", Port: 9, Protocol: kubeapi.ProtocolSCTP}), both, 1, []string{SkipProtocol}},
		{"unknown protocol", svc("a", []string{"10.96.0.1"}, kubeapi.ServicePort{Port: 9, Protocol: "QUIC"}), both, 0, []string{SkipProtocol}},
		{"v6 on v4-only node", svc("a", []string{"fd00::1"}, tcp), Families{IPv4: true}, 0, []string{SkipFamily}},
		{"dual-stack on v4-only node", svc("a", []string{"10.96.0.1", "fd00::1"}, tcp), Families{IPv4: true}, 1, []string{SkipFamily}},
		{"bad address", svc("a", []string{"10.96.0.300"}, tcp), both, 0, []string{SkipBadAddress}},
		{"headless", svc("a", []string{"None"}, tcp), both, 0, nil},
		{"deleted", nil, both, 0, nil},
	} {
		e, skipped := serviceEntries(c.svc, nil, c.fam, Topology{})
		if len(e) != c.want || !slices.Equal(skipped, c.skipped) {
			t.Errorf("%s: %d frontends, skipped %v; want %d, %v", c.name, len(e), skipped, c.want, c.skipped)
		}
	}
}

func TestParseFile(t *testing.T) {
	byName, skipped, err := ParseFile([]byte(`
services:
- {name: web, ip: 10.96.0.10, port: 80, backends: ["10.0.0.1:8080", "10.0.0.2:8080"]}
- {name: web, ip: 10.96.0.10, port: 443, backends: []}
- {name: dns, ip: "fd00::10", port: 53, protocol: udp, backends: ["[fd00::2]:53"]}
- {name: bad, ip: 10.96.0.11, port: 80, protocol: sctp, backends: []}
- {name: bad2, ip: 10.96.0.12, port: 80, backends: ["[fd00::2]:80"]}
`), both)
	if err != nil {
		t.Fatal(err)
	}
	if len(byName["web"]) != 2 || len(byName["dns"]) != 1 || len(byName["bad"])+len(byName["bad2"]) != 0 {
		t.Errorf("entries %v", byName)
	}
	if !slices.Equal(skipped["bad"], []string{SkipProtocol}) || !slices.Equal(skipped["bad2"], []string{SkipBadAddress}) || len(skipped) != 2 {
		t.Errorf("skipped %v", skipped)
	}
	if _, _, err := ParseFile([]byte("services:\n- {name: x, vip: 1.2.3.4}\n"), both); err == nil {
		t.Error("unknown field accepted")
	}
	if _, _, err := ParseFile([]byte(`{"services": [{"name": "j", "ip": "10.1.1.1", "port": 1, "backends": ["10.0.0.1:1"]}]}`), both); err != nil {
		t.Errorf("JSON: %v", err)
	}
}

// countingLB counts the writes that reach the real load balancer.
type countingLB struct {
	*lb.LB
	sets, deletes int
	last          map[lb.Frontend]lb.Target // what each frontend was last written with
}

func (c *countingLB) SetFrontend(f lb.Frontend, tg lb.Target) error {
	c.sets++
	if c.last == nil {
		c.last = map[lb.Frontend]lb.Target{}
	}
	c.last[f] = tg
	return c.LB.SetFrontend(f, tg)
}

func (c *countingLB) DeleteFrontend(f lb.Frontend) error {
	c.deletes++
	delete(c.last, f)
	return c.LB.DeleteFrontend(f)
}

// TestTableIncremental: changing one Service of many writes that Service's
// frontends only; an unchanged Service writes nothing; a conflicting
// frontend is skipped and counted; deleting everything empties the maps.
func TestTableIncremental(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the load balancer's maps need root: run go test as root")
	}
	l, err := lb.Load(lb.Config{MaxFrontends: 2048, MaxBackends: 4096, MaxSlots: 8192})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w := &countingLB{LB: l}
	tb := NewTable(w, nil, nil)
	entries := func(i, backends int) Entries {
		f := lb.Frontend{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: lb.TCP}
		var bes []lb.Backend
		for j := range backends {
			bes = append(bes, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i), byte(j + 1)}), 8080))
		}
		return Entries{f: {Backends: bes}}
	}
	for i := range 1000 {
		tb.Apply(string(rune('a'+i%26))+string(rune(i)), entries(i, 2), nil, time.Now())
	}
	if w.sets != 1000 || l.Frontends() != 1000 || l.BackendRefs() != 2000 {
		t.Fatalf("%d writes, %d frontends, %d slots after 1000 Services", w.sets, l.Frontends(), l.BackendRefs())
	}
	name := tb.Names()[500]
	cur := tb.Frontends(name)
	w.sets = 0
	tb.Apply(name, cur, nil, time.Now())
	if w.sets+w.deletes != 0 {
		t.Errorf("unchanged Service: %d sets %d deletes", w.sets, w.deletes)
	}
	for f, tg := range cur {
		cur[f] = lb.Target{Backends: append(tg.Backends, netip.MustParseAddrPort("10.9.9.9:8080"))}
	}
	tb.Apply(name, cur, nil, time.Now())
	if w.sets != 1 || w.deletes != 0 || l.BackendRefs() != 2001 {
		t.Errorf("one Service scaled: %d sets %d deletes, %d slots", w.sets, w.deletes, l.BackendRefs())
	}
	if tb.frontends != l.Frontends() || tb.backends != l.BackendRefs() {
		t.Errorf("table totals %d frontends %d slots, maps %d %d", tb.frontends, tb.backends, l.Frontends(), l.BackendRefs())
	}
	tb.Apply("intruder", cur, nil, time.Now())
	if s := tb.Skipped(); s[SkipConflict] != 1 || len(tb.Frontends("intruder")) != 0 {
		t.Errorf("conflict: skipped %v, intruder has %v", s, tb.Frontends("intruder"))
	}
	tb.Apply("intruder", nil, nil, time.Now())
	if s := tb.Skipped(); len(s) != 0 {
		t.Errorf("intruder gone: still skipped %v", s)
	}
	for _, n := range tb.Names() {
		tb.Apply(n, nil, nil, time.Now())
	}
	if l.Frontends() != 0 || l.BackendRefs() != 0 || len(tb.Names()) != 0 || tb.frontends != 0 || tb.backends != 0 {
		t.Errorf("after deleting all: %d frontends, %d slots, names %v", l.Frontends(), l.BackendRefs(), tb.Names())
	}
}

// TestServiceEntriesNodePort: a NodePort Service has a NodePort frontend
// per family; externalTrafficPolicy Local keeps the endpoints on this node
// (by nodeName) and the client's source, Cluster all of them.
func TestServiceEntriesNodePort(t *testing.T) {
	web := kubeapi.ServicePort{Name: "web", Port: 80, Protocol: kubeapi.ProtocolTCP, NodePort: 30080}
	s := svc("a", []string{"10.96.0.1"}, web)
	s.Spec.Type = kubeapi.ServiceTypeNodePort
	sl := slice("a", kubeapi.AddressTypeIPv4, "web", 8080, ep{addr: "10.0.0.1"}, ep{addr: "10.0.0.2"})
	sl.Endpoints[0].NodeName = ptr.To("n1")
	sl.Endpoints[1].NodeName = ptr.To("n2")
	np := lb.Frontend{Addr: netip.IPv4Unspecified(), Port: 30080, Proto: lb.TCP, NodePort: true}
	e, _ := serviceEntries(s, []*kubeapi.EndpointSlice{sl}, both, Topology{Name: "n1"})
	if got := sortedBackends(e[np].Backends); len(e) != 2 || !slices.Equal(got, aps("10.0.0.1:8080", "10.0.0.2:8080")) || e[np].KeepSource {
		t.Errorf("Cluster: %v", e)
	}
	s.Spec.ExternalTrafficPolicy = kubeapi.ServiceExternalTrafficPolicyLocal
	e, _ = serviceEntries(s, []*kubeapi.EndpointSlice{sl}, both, Topology{Name: "n1"})
	if got := e[np].Backends; !slices.Equal(got, aps("10.0.0.1:8080")) || !e[np].KeepSource {
		t.Errorf("Local on n1: %v", e[np])
	}
	s.Spec.Type = kubeapi.ServiceTypeClusterIP
	if e, _ = serviceEntries(s, []*kubeapi.EndpointSlice{sl}, both, Topology{Name: "n1"}); len(e) != 1 {
		t.Errorf("ClusterIP Service with a stale nodePort: %v", e)
	}
}

// TestServiceEntriesExternal: ExternalIPs and load-balancer IPs are
// frontends of the cluster's endpoints whatever the traffic policies (as
// kube-proxy routes pods' and the node's traffic to them), without a
// NodePort of their own; an IP of ipMode Proxy is left to the load
// balancer (counted), a hostname ingress ignored, another family skipped.
func TestServiceEntriesExternal(t *testing.T) {
	web := kubeapi.ServicePort{Name: "web", Port: 80, Protocol: kubeapi.ProtocolTCP, NodePort: 30080}
	s := svc("a", []string{"10.96.0.1"}, web)
	s.Spec.Type = kubeapi.ServiceTypeLoadBalancer
	s.Spec.ExternalIPs = []string{"192.0.2.10", "2001:db8::10"}
	s.Spec.ExternalTrafficPolicy = kubeapi.ServiceExternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = ptr.To(kubeapi.ServiceInternalTrafficPolicyLocal)
	s.Status.LoadBalancer.Ingress = []kubeapi.LoadBalancerIngress{
		{IP: "198.51.100.7"},
		{IP: "198.51.100.8", IPMode: ptr.To(kubeapi.LoadBalancerIPModeVIP)},
		{IP: "198.51.100.9", IPMode: ptr.To(kubeapi.LoadBalancerIPModeProxy)},
		{IP: ""}, // a hostname
	}
	sl := slice("a", kubeapi.AddressTypeIPv4, "web", 8080, ep{addr: "10.0.0.1"}, ep{addr: "10.0.0.2"})
	sl.Endpoints[0].NodeName = ptr.To("n1")
	sl.Endpoints[1].NodeName = ptr.To("n2")
	e, skipped := serviceEntries(s, []*kubeapi.EndpointSlice{sl}, Families{IPv4: true}, Topology{Name: "n1"})
	all, local := aps("10.0.0.1:8080", "10.0.0.2:8080"), aps("10.0.0.1:8080")
	for _, c := range []struct {
		addr string
		want []lb.Backend
	}{{"10.96.0.1", local}, {"192.0.2.10", all}, {"198.51.100.7", all}, {"198.51.100.8", all}} {
		f := lb.Frontend{Addr: netip.MustParseAddr(c.addr), Port: 80, Proto: lb.TCP}
		if got := sortedBackends(e[f].Backends); !slices.Equal(got, c.want) {
			t.Errorf("%s: backends %v, want %v", c.addr, got, c.want)
		}
	}
	np := lb.Frontend{Addr: netip.IPv4Unspecified(), Port: 30080, Proto: lb.TCP, NodePort: true}
	if len(e) != 5 || !e[np].KeepSource {
		t.Errorf("want the ClusterIP, 3 external frontends and one NodePort (Local): %v", e)
	}
	slices.Sort(skipped)
	if !slices.Equal(skipped, []string{SkipFamily, SkipLBProxy}) {
		t.Errorf("skipped %v, want the IPv6 ExternalIP (family) and the Proxy-mode IP", skipped)
	}
	s.Spec.Type = kubeapi.ServiceTypeClusterIP // load-balancer IPs only with type LoadBalancer
	if e, _ := serviceEntries(s, []*kubeapi.EndpointSlice{sl}, Families{IPv4: true}, Topology{Name: "n1"}); len(e) != 2 {
		t.Errorf("ClusterIP with ExternalIPs and a stale status: %v", e)
	}
}

// TestExternalIPCannotTakeAClusterIP plays a tenant who owns a namespace and
// creates a Service whose ExternalIP is another Service's ClusterIP (the
// cluster DNS's, say), applied first (the agent's first sync walks its
// cache in any order): the ClusterIP's Service still gets its frontend, the
// tenant's ExternalIP is skipped as a conflict, whichever comes first, and
// a later Apply of the tenant's Service does not take it back.
func TestExternalIPCannotTakeAClusterIP(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("the load balancer's maps need root: run go test as root")
	}
	l, err := lb.Load(lb.Config{MaxFrontends: 64, MaxBackends: 64, MaxSlots: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dns := svc("kube-dns", []string{"10.96.0.10"}, kubeapi.ServicePort{Name: "dns", Port: 53, Protocol: kubeapi.ProtocolTCP})
	dnsSl := slice("kube-dns", kubeapi.AddressTypeIPv4, "dns", 53, ep{addr: "10.0.0.53"})
	evil := svc("evil", []string{"10.96.0.99"}, kubeapi.ServicePort{Name: "dns", Port: 53, Protocol: kubeapi.ProtocolTCP})
	evil.Spec.ExternalIPs = []string{"10.96.0.10"}
	evilSl := slice("evil", kubeapi.AddressTypeIPv4, "dns", 53, ep{addr: "10.0.0.66"})
	f := lb.Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: lb.TCP}
	fam := Families{IPv4: true}
	for _, evilFirst := range []bool{true, false} {
		w := &countingLB{LB: l}
		tb := NewTable(w, nil, nil)
		de, _ := serviceEntries(dns, []*kubeapi.EndpointSlice{dnsSl}, fam, Topology{})
		ee, es := serviceEntries(evil, []*kubeapi.EndpointSlice{evilSl}, fam, Topology{})
		if evilFirst {
			tb.Apply("ns/evil", ee, es, time.Now())
			tb.Apply("ns/kube-dns", de, nil, time.Now())
		} else {
			tb.Apply("ns/kube-dns", de, nil, time.Now())
			tb.Apply("ns/evil", ee, es, time.Now())
		}
		tb.Apply("ns/evil", ee, es, time.Now()) // and once more
		if got := tb.Frontends("ns/kube-dns")[f].Backends; !slices.Equal(got, aps("10.0.0.53:53")) {
			t.Errorf("tenant first %v: kube-dns's ClusterIP frontend has %v, want its own backend", evilFirst, got)
		}
		if _, ok := tb.Frontends("ns/evil")[f]; ok {
			t.Errorf("tenant first %v: the tenant's Service holds %s", evilFirst, f)
		}
		if got := w.last[f].Backends; !slices.Equal(sortedBackends(got), aps("10.0.0.53:53")) {
			t.Errorf("tenant first %v: the written frontend %s translates to %v", evilFirst, f, got)
		}
		for _, n := range tb.Names() {
			tb.Apply(n, nil, nil, time.Now())
		}
	}
}
