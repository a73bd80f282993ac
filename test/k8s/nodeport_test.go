//go:build k8s

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/k8scluster"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// The external client of TestServicesAPINodePort: a network namespace on
// a veth whose host end is the one device eztunnel's NodePort program is
// on, with an address of its own (extNodeIP): the node address NodePorts
// answer on through eztunnel. kube-proxy answers NodePorts on
// k8scluster.NodeIP only (nodePortAddresses), reached over the same veth.
const (
	extNetns  = "ezk8s-ext"
	extLink   = "ezk8sx0"    // host end
	extNodeIP = "10.250.1.1" // on extLink: eztunnel's node address
	extIP     = "10.250.1.2" // the client
	npPin     = "/sys/fs/bpf/eztunnel-nptest"
)

// extNet makes the external client's namespace and veth, removed when the
// test ends (and first, if a killed run left them).
func extNet(t testing.TB) {
	t.Helper()
	ip := func(args ...string) error {
		out, err := sysexec.Command(context.Background(), "ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	clean := func() {
		ip("netns", "del", extNetns)
		ip("link", "del", extLink)
	}
	clean()
	t.Cleanup(clean)
	for _, args := range [][]string{
		{"netns", "add", extNetns},
		{"link", "add", extLink, "type", "veth", "peer", "name", "eth0", "netns", extNetns},
		{"addr", "add", extNodeIP + "/24", "dev", extLink},
		{"link", "set", extLink, "up"},
		{"-n", extNetns, "addr", "add", extIP + "/24", "dev", "eth0"},
		{"-n", extNetns, "link", "set", "eth0", "up"},
		{"-n", extNetns, "link", "set", "lo", "up"},
		{"-n", extNetns, "route", "add", "default", "via", extNodeIP},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
}

// extPeer runs `eztunnel-lab workload peer` in the external namespace.
func extPeer(t testing.TB, ctx context.Context, addr string, udp bool, n int) []workload.PeerAnswer {
	t.Helper()
	args := []string{"netns", "exec", extNetns, filepath.Join(workDir, "eztunnel-lab"), "workload", "peer", "--addr", addr,
		"--n", strconv.Itoa(n), "--timeout", "2s"}
	if udp {
		args = append(args, "--udp", "--size", "200")
	} else {
		args = append(args, "--size", "65536")
	}
	out, err := sysexec.Command(ctx, "ip", args...).Output()
	var as []workload.PeerAnswer
	if jerr := json.Unmarshal(out, &as); err != nil || jerr != nil || len(as) != n {
		t.Fatalf("peer %s (udp %v): %v %v: %q", addr, udp, err, jerr, out)
	}
	return as
}

// outcome is what a client observes of a batch of answers: the backends
// that answered (sorted, once each), the source addresses they saw (ports
// dropped), and the errors by kind.
type outcome struct {
	backends, seen, errs []string
}

func (o outcome) String() string {
	return fmt.Sprintf("backends %v, sources seen %v, errors %v", o.backends, o.seen, o.errs)
}

func outcomeOf(as []workload.PeerAnswer) outcome {
	b, s, e := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, a := range as {
		switch {
		case a.Err == "":
			b[a.Backend] = true
			if h, _, err := net.SplitHostPort(a.Seen); err == nil {
				s[h] = true
			}
		case strings.Contains(a.Err, "i/o timeout"):
			e["timeout"] = true
		case strings.Contains(a.Err, "connection refused"):
			e["refused"] = true
		default:
			e[a.Err] = true // not exact (hash, datagram), or unexpected
		}
	}
	return outcome{slices.Sorted(maps.Keys(b)), slices.Sorted(maps.Keys(s)), slices.Sorted(maps.Keys(e))}
}

// TestServicesAPINodePort: NodePort Services (externalTrafficPolicy
// Cluster and Local) from the real API server, endpoints the test writes,
// reached from an external client namespace through eztunnel's tc NodePort
// program (`eztunnel run --services --nodeport --nodeport-devices ezk8sx0`)
// and, as the baseline, through the real kube-proxy (iptables). Every case
// must give the same outcome both ways: TCP byte-exact (sha256 of 64 KiB
// per connection) and UDP datagrams echoed whole, answered only by the
// allowed backends (Local: the node's endpoint only; with none, what the
// client sees must match: kube-proxy drops). Then the Local Service's
// local endpoint is taken away through the API (both drop) and given back
// (both answer from it again).
//
// The two datapaths never handle the same packets: eztunnel's node address
// is the veth's own (10.250.1.1; its node addresses are its NodePort
// devices'), kube-proxy's nodePortAddresses are 10.250.0.1/32 only, so its
// KUBE-NODEPORTS rules never match 10.250.1.1 (checked before the agent
// starts: nothing answers there) and eztunnel's program leaves packets to
// 10.250.0.1 alone (checked: its NodePort counter does not move while
// kube-proxy's path is used). One exception, kube-proxy's by design: its
// filter rule for a Local Service without local endpoints drops NodePort
// packets to every local address (-m addrtype --dst-type LOCAL), so what
// eztunnel leaves to the kernel path there is dropped by kube-proxy's rule,
// as on any node running both. The cluster is IPv4-only: no IPv6 case.
func TestServicesAPINodePort(tt *testing.T) {
	t := summarized(tt)
	const ns = "ez-np"
	podYAML := func(name string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: w
    image: %s
    imagePullPolicy: Never
    env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    args: [workload, serve, --peer, "0.0.0.0:7400", --peer-udp, "0.0.0.0:7401", --name, "$(POD_NAME)"]
`, name, ns, labImage)
	}
	applyNamespace(t, ns, nil, podYAML("n1")+podYAML("n2"), "n1", "n2")
	ip := map[string]string{}
	for _, p := range []string{"n1", "n2"} {
		ip[p] = podIP(t, ns, p)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cl.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	extNet(t)

	// Services: Cluster and Local with both endpoints (n1 on this node, n2
	// said to be on another), and Local with only the remote one.
	type npSvc struct {
		name      string
		local     bool
		endpoints []string // pods
		tcp, udp  int32    // nodePorts, from the API server
	}
	svcs := []*npSvc{{name: "np-cluster", endpoints: []string{"n1", "n2"}}, {name: "np-local", local: true, endpoints: []string{"n1", "n2"}},
		{name: "np-none", local: true, endpoints: []string{"n2"}}}
	// sliceOf is s's EndpointSlice: n1 on this node, n2 said to be on
	// another.
	sliceOf := func(s *npSvc) *discoveryv1.EndpointSlice {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: s.name + "-1", Labels: map[string]string{
				discoveryv1.LabelServiceName: s.name, discoveryv1.LabelManagedBy: "eztunnel-test"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("tcp"), Port: ptr.To[int32](7400), Protocol: ptr.To(corev1.ProtocolTCP)},
				{Name: ptr.To("udp"), Port: ptr.To[int32](7401), Protocol: ptr.To(corev1.ProtocolUDP)}},
		}
		for _, p := range s.endpoints {
			node := "elsewhere"
			if p == "n1" {
				node = k8scluster.NodeName
			}
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip[p]}, NodeName: ptr.To(node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
		}
		return sl
	}
	for _, s := range svcs {
		etp := corev1.ServiceExternalTrafficPolicyCluster
		if s.local {
			etp = corev1.ServiceExternalTrafficPolicyLocal
		}
		got, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: s.name},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ExternalTrafficPolicy: etp, Ports: []corev1.ServicePort{
				{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(7400)},
				{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(7401)}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.tcp, s.udp = got.Spec.Ports[0].NodePort, got.Spec.Ports[1].NodePort
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, sliceOf(s), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// noLocalRule: kube-proxy has its rule for a Service port ("name:port")
	// with endpoints but none local (it drops NodePort packets).
	noLocalRule := func(port string) bool {
		t.Helper()
		out, err := sysexec.Command(ctx, "iptables-save", "-t", "filter").Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(out), `"`+ns+`/`+port+` has no local endpoints"`)
	}
	via := func(node string, port int32) string { return net.JoinHostPort(node, strconv.Itoa(int(port))) }
	// kube-proxy programmed all three (its rules for np-cluster name both
	// endpoints; the others answer or drop as below once programmed).
	waitKubeProxy(t, ns+"/np-cluster:tcp", net.JoinHostPort(ip["n1"], "7400"), net.JoinHostPort(ip["n2"], "7400"))
	for _, s := range svcs[:2] {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			if o := outcomeOf(extPeer(t, ctx, via(k8scluster.NodeIP, s.tcp), false, 1)); len(o.errs) == 0 {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("%s through kube-proxy: %v", s.name, o)
			}
		}
	}
	// kube-proxy's drop for np-none (no local endpoint) is in place.
	for _, port := range []string{"np-none:tcp", "np-none:udp"} {
		for deadline := time.Now().Add(time.Minute); !noLocalRule(port); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("kube-proxy has no rule for %s/%s without local endpoints", ns, port)
			}
		}
	}
	// Before eztunnel runs nothing answers on its address: kube-proxy
	// leaves it alone.
	for _, s := range svcs[:2] {
		if o := outcomeOf(extPeer(t, ctx, via(extNodeIP, s.tcp), false, 1)); len(o.backends) > 0 {
			t.Fatalf("%s on %s answered before eztunnel ran: %v", s.name, extNodeIP, o)
		}
	}

	ag := startSvcAgent(t, npPin, "--nodeport", "--nodeport-healthcheck-addresses", "127.0.0.1", "--nodeport-devices", extLink)
	counter := func(name string) float64 {
		t.Helper()
		m, err := scrapeAt(ag.metricsAddr)
		if err != nil {
			t.Fatal(err)
		}
		return m[name]
	}
	const translated = `eztunnel_services_translations_total{kind="nodeport"}`
	const noBackend = `eztunnel_services_failures_total{reason="nodeport_no_backend"}`
	// eztunnel's NodePorts are written once its first sync is done (ready).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if o := outcomeOf(extPeer(t, ctx, via(extNodeIP, svcs[0].tcp), false, 1)); len(o.errs) == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("np-cluster through eztunnel: %v", o)
		}
	}

	// check compares both datapaths on s's NodePort, TCP or UDP.
	check := func(s *npSvc, udp bool) {
		t.Helper()
		allowed := map[string]bool{}
		for _, p := range s.endpoints {
			if !s.local || p == "n1" {
				allowed[p] = true
			}
		}
		noLocal := len(allowed) == 0
		proto, port, n := "TCP", s.tcp, 16
		if udp {
			proto, port, n = "UDP", s.udp, 50
		}
		if noLocal {
			n = 3 // each one waits for its timeout
		}
		what := fmt.Sprintf("%s %s", s.name, proto)
		tr0, nb0 := counter(translated), counter(noBackend)
		kp := outcomeOf(extPeer(t, ctx, via(k8scluster.NodeIP, port), udp, n))
		if tr, nb := counter(translated), counter(noBackend); tr != tr0 || nb != nb0 {
			t.Errorf("%s: eztunnel's NodePort program acted on kube-proxy's traffic (translations %v -> %v, no backend %v -> %v)", what, tr0, tr, nb0, nb)
		}
		tr0, nb0 = counter(translated), counter(noBackend)
		ez := outcomeOf(extPeer(t, ctx, via(extNodeIP, port), udp, n))
		tr, nb := counter(translated), counter(noBackend)
		t.Logf("%s: through eztunnel %v; through kube-proxy %v", what, ez, kp)
		for _, o := range []outcome{kp, ez} {
			for _, b := range o.backends {
				if !allowed[b] {
					t.Errorf("%s: answered by %s, allowed %v", what, b, slices.Sorted(maps.Keys(allowed)))
				}
			}
		}
		if noLocal {
			// No local endpoint: kube-proxy drops; eztunnel leaves the
			// flow to the kernel path (counted), where kube-proxy's
			// rule drops it too.
			if len(kp.backends)+len(ez.backends) > 0 || !slices.Equal(kp.errs, []string{"timeout"}) || !slices.Equal(kp.errs, ez.errs) {
				t.Errorf("%s without a local endpoint: through eztunnel %v, through kube-proxy %v: want the same timeout (a drop)", what, ez, kp)
			}
			if nb-nb0 < 1 {
				t.Errorf("%s: eztunnel's nodeport_no_backend moved by %v", what, nb-nb0)
			}
			return
		}
		if len(kp.errs)+len(ez.errs) > 0 {
			t.Errorf("%s: through eztunnel %v; through kube-proxy %v: want every one answered exactly", what, ez, kp)
		}
		if !udp && !s.local && len(allowed) == 2 && (len(ez.backends) != 2 || len(kp.backends) != 2) {
			// 16 connections: both backends answer, but for 2^-15.
			t.Errorf("%s: through eztunnel %v; through kube-proxy %v: want both backends", what, ez, kp)
		}
		if udp && (len(ez.backends) != 1 || len(kp.backends) != 1) {
			t.Errorf("%s: one socket's datagrams answered by %v (eztunnel), %v (kube-proxy): want one backend each", what, ez.backends, kp.backends)
		}
		// Local keeps the client's address on both; Cluster shows
		// eztunnel's node address (the one the client used), and
		// kube-proxy's masquerade (the pods' bridge address).
		if s.local && (!slices.Equal(ez.seen, []string{extIP}) || !slices.Equal(kp.seen, []string{extIP})) {
			t.Errorf("%s: backends saw %v (eztunnel), %v (kube-proxy): want the client's %s", what, ez.seen, kp.seen, extIP)
		}
		if !s.local && !slices.Equal(ez.seen, []string{extNodeIP}) {
			t.Errorf("%s: backends saw %v through eztunnel, want the node address %s", what, ez.seen, extNodeIP)
		}
		want := float64(n) // a flow per connection
		if udp {
			want = 1 // one socket: one flow
		}
		if tr-tr0 < want {
			t.Errorf("%s: %v NodePort flows translated, want at least %v", what, tr-tr0, want)
		}
	}
	for _, s := range svcs {
		for _, udp := range []bool{false, true} {
			check(s, udp)
		}
	}

	// Through the API: np-local loses its local endpoint (both datapaths
	// then drop), then gets it back.
	syncs := func() float64 {
		m, err := scrapeAt(ag.metricsAddr)
		if err != nil {
			t.Fatal(err)
		}
		return m["eztunnel_services_sync_seconds_count"]
	}
	for _, eps := range [][]string{{"n2"}, {"n1", "n2"}} {
		local := svcs[1]
		local.endpoints = eps
		n := syncs()
		cur, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, local.name+"-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		next := sliceOf(local)
		next.ResourceVersion = cur.ResourceVersion
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, next, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(time.Minute); syncs() <= n || noLocalRule("np-local:tcp") != (len(eps) == 1); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("np-local with endpoints %v: eztunnel synced %v times since, kube-proxy's no-local-endpoints rule %v", eps, syncs()-n, noLocalRule("np-local:tcp"))
			}
		}
		check(local, false)
	}
	ag.stop()
}
