//go:build k8s

package k8s

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
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
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// svcPin is where the --services test's agent pins its shortcut (not the
// DaemonSet's pinPath); removed at the end.
const svcPin = "/sys/fs/bpf/eztunnel-svctest"

// hostStream runs `eztunnel-lab workload stream` on the host, outside the
// pods' cgroup: a ClusterIP is reached through kube-proxy's iptables rules.
func hostStream(ctx context.Context, addr string, conns int) (workload.StreamReport, error) {
	cmd := sysexec.Command(ctx, filepath.Join(workDir, "eztunnel-lab"), "workload", "stream", "--addr", addr,
		"--conns", strconv.Itoa(conns), "--up", "65536", "--down", "65536", "--seed", strconv.FormatInt(time.Now().UnixNano()%1e9, 10))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var rep workload.StreamReport
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil && err == nil {
		err = fmt.Errorf("stream report %q: %w", out.String(), jerr)
	}
	if err != nil {
		err = fmt.Errorf("%w: %s", err, errb.String())
	}
	return rep, err
}

// kubeProxyRules reads what kube-proxy programmed for svcPort
// ("namespace/name:port"): the endpoints its KUBE-SVC chain sends to, and
// whether its no-endpoints REJECT rule is there.
func kubeProxyRules(t testing.TB, svcPort string) (eps []string, reject bool) {
	t.Helper()
	save := func(table string) string {
		out, err := sysexec.Command(context.Background(), "iptables-save", "-t", table).Output()
		if err != nil {
			t.Fatalf("iptables-save -t %s: %v", table, err)
		}
		return string(out)
	}
	mark := `--comment "` + svcPort + ` -> `
	for _, l := range strings.Split(save("nat"), "\n") {
		// KUBE-SVC: the Cluster policy's chain; KUBE-SVL: the Local one
		// (internalTrafficPolicy Local).
		if !strings.HasPrefix(l, "-A KUBE-SVC-") && !strings.HasPrefix(l, "-A KUBE-SVL-") {
			continue
		}
		if _, rest, ok := strings.Cut(l, mark); ok {
			ep, _, _ := strings.Cut(rest, `"`)
			eps = append(eps, ep)
		}
	}
	slices.Sort(eps)
	return eps, strings.Contains(save("filter"), `"`+svcPort+` has no endpoints"`)
}

// waitKubeProxy waits until kube-proxy programmed exactly these endpoints
// for svcPort (none: its REJECT rule): the comparison runs against the same
// state on both sides.
func waitKubeProxy(t testing.TB, svcPort string, want ...string) {
	t.Helper()
	slices.Sort(want)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		eps, reject := kubeProxyRules(t, svcPort)
		if slices.Equal(eps, want) && reject == (len(want) == 0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-proxy's rules for %s: endpoints %v, reject %v; want %v", svcPort, eps, reject, want)
		}
	}
}

// TestServicesAPI runs `eztunnel run --services --kubeconfig` on the host,
// attached to the pods' root cgroup, against the cluster's real API server:
// a Service without selector and an EndpointSlice the test writes with
// client-go. A client pod reaches the ClusterIP through eztunnel (connect-time
// translation), the host through kube-proxy (iptables); every phase must
// give both the same outcome: byte-exact streams while endpoints are scaled,
// a not-ready terminating endpoint ignored while ready ones exist (its pod
// deleted), serving terminating endpoints used when no endpoint is ready,
// the same connect error with no endpoints, and the frontend gone with the
// Service.
func TestServicesAPI(tt *testing.T) {
	t := summarized(tt)
	const ns = "ez-svc"
	podYAML := func(name string) string { return streamUDPPod(name, ns) }
	applyNamespace(t, ns, nil, podYAML("s1")+podYAML("s2")+podYAML("s3")+podYAML("c"), "s1", "s2", "s3", "c")
	ip := map[string]string{}
	for _, p := range []string{"s1", "s2", "s3"} {
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

	// The agent, on the host, attached to the pods' root cgroup.
	// NodePorts on the node's own link only (no traffic arrives there);
	// health checks on loopback: kube-proxy serves them on the node
	// address (nodePortAddresses).
	ag := startSvcAgent(t, svcPin, "--nodeport", "--nodeport-healthcheck-addresses", "127.0.0.1", "--nodeport-devices", k8scluster.NodeLink)
	metricsAddr := ag.metricsAddr
	metricsNow := func() map[string]float64 { return metricsAt(t, metricsAddr) }
	waitMetrics := func(what string, ok func(m map[string]float64) bool) map[string]float64 {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			m := metricsNow()
			if ok(m) {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached in 30 s: frontends %v slots %v syncs %v", what, m["eztunnel_services_frontends"],
					m["eztunnel_services_backend_slots"], m["eztunnel_services_sync_seconds_count"])
			}
		}
	}
	base := metricsNow() // the default/kubernetes Service is translated too
	f0, s0 := base["eztunnel_services_frontends"], base["eztunnel_services_backend_slots"]
	if f0 < 1 {
		t.Fatalf("no frontend for the kubernetes Service: %v", f0)
	}

	svc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "stream", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(7000)},
			{Name: "dgram", Port: 53, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(7001)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	udpVIP := net.JoinHostPort(svc.Spec.ClusterIP, "53")
	type epState struct {
		pod                         string
		ready, serving, terminating bool
	}
	slice := func(eps ...epState) *discoveryv1.EndpointSlice {
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{
				discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "eztunnel-test"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: ptr.To("stream"), Port: ptr.To[int32](7000), Protocol: ptr.To(corev1.ProtocolTCP)},
				{Name: ptr.To("dgram"), Port: ptr.To[int32](7001), Protocol: ptr.To(corev1.ProtocolUDP)}},
			Endpoints: []discoveryv1.Endpoint{},
		}
		for _, e := range eps {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip[e.pod]},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready), Serving: ptr.To(e.serving), Terminating: ptr.To(e.terminating)}})
		}
		return sl
	}
	syncs := func() float64 { return metricsNow()["eztunnel_services_sync_seconds_count"] }
	setSlice := func(sl *discoveryv1.EndpointSlice, create bool) {
		t.Helper()
		if create {
			_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, sl, metav1.CreateOptions{})
		} else {
			_, err = cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, sl, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// updateSlice replaces the slice named like next with it.
	updateSlice := func(next *discoveryv1.EndpointSlice) {
		t.Helper()
		cur, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, next.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		next.ResourceVersion = cur.ResourceVersion
		setSlice(next, false)
	}
	// both streams to the ClusterIP from the pod (eztunnel) and from the host
	// (kube-proxy, whose rules the caller waited for) and returns both
	// reports.
	both := func(what string, wantOK bool) (pod, host workload.StreamReport) {
		t.Helper()
		args := []string{"-n", ns, "exec", "c", "-c", "w", "--", "/eztunnel-lab", "workload", "stream", "--addr", vip, "--conns", "16",
			"--up", "65536", "--down", "65536", "--seed", "7"}
		out, err := cl.Kubectl(ctx, args...)
		if jerr := json.Unmarshal(out, &pod); jerr != nil {
			t.Fatalf("%s: pod stream: %v %v: %q", what, err, jerr, out)
		}
		host, err = hostStream(ctx, vip, 16)
		if wantOK && (pod.Conns != 16 || len(pod.Failures) > 0 || host.Conns != 16 || len(host.Failures) > 0) {
			t.Fatalf("%s: through eztunnel %+v; through kube-proxy %+v (%v)", what, pod, host, err)
		}
		if wantOK {
			// Numbered datagrams on a connected UDP socket, each echoed whole.
			udpArgs := []string{"workload", "udp", "--addr", udpVIP, "--n", "200", "--size", "100"}
			var pu, hu workload.UDPResult
			out, err := cl.Kubectl(ctx, append([]string{"-n", ns, "exec", "c", "-c", "w", "--", "/eztunnel-lab"}, udpArgs...)...)
			if jerr := json.Unmarshal(out, &pu); err != nil || jerr != nil {
				t.Fatalf("%s: pod UDP: %v %v: %q", what, err, jerr, out)
			}
			out, err = sysexec.Command(ctx, filepath.Join(workDir, "eztunnel-lab"), udpArgs...).Output()
			if jerr := json.Unmarshal(out, &hu); err != nil || jerr != nil {
				t.Fatalf("%s: host UDP: %v %v: %q", what, err, jerr, out)
			}
			if pu.Echoed != pu.Sent || hu.Echoed != hu.Sent {
				t.Errorf("%s: UDP through eztunnel %d of %d echoed, through kube-proxy %d of %d", what, pu.Echoed, pu.Sent, hu.Echoed, hu.Sent)
			}
		}
		return pod, host
	}

	// 1: two ready endpoints.
	n := syncs()
	setSlice(slice(epState{"s1", true, true, false}, epState{"s2", true, true, false}), true)
	waitMetrics("Service with 2 endpoints", func(m map[string]float64) bool {
		return m["eztunnel_services_frontends"] == f0+2 && m["eztunnel_services_backend_slots"] == s0+4 && m["eztunnel_services_sync_seconds_count"] > n
	})
	ep := func(pod string) string { return net.JoinHostPort(ip[pod], "7000") }
	const svcPort = ns + "/web:stream"
	waitKubeProxy(t, svcPort, ep("s1"), ep("s2"))
	tr0 := metricsNow()[`eztunnel_services_translations_total{kind="tcp_connect"}`]
	both("2 ready endpoints", true)
	if tr := metricsNow()[`eztunnel_services_translations_total{kind="tcp_connect"}`]; tr-tr0 < 16 {
		t.Errorf("%v TCP connects translated for 16 streams", tr-tr0)
	}
	if u := metricsNow()[`eztunnel_services_translations_total{kind="udp_connect"}`]; u < 1 {
		t.Errorf("%v UDP connects translated", u)
	}

	// 2: s1 terminating (still serving), s2 and s3 ready; then s1's pod is
	// deleted: nothing may still go there.
	// The change is made while the pod opens connections to the ClusterIP,
	// two at a time: none may fail (s1 still serves its own).
	n = syncs()
	during := make(chan error, 1)
	go func() {
		out, err := cl.Kubectl(ctx, "-n", ns, "exec", "c", "-c", "w", "--", "/eztunnel-lab", "workload", "stream", "--addr", vip,
			"--conns", "6000", "--parallel", "2", "--up", "16384", "--down", "16384", "--seed", "11")
		var rep workload.StreamReport
		if jerr := json.Unmarshal(out, &rep); err != nil || jerr != nil || rep.Conns != 6000 || len(rep.Failures) > 0 {
			err = fmt.Errorf("%v %v %+v: %q", err, jerr, rep, out)
		} else {
			t.Logf("6000 connections in %.1f s while the endpoints changed", rep.Seconds)
		}
		during <- err
	}()
	time.Sleep(time.Second) // kubectl exec started, connections are flowing
	updateSlice(slice(epState{"s1", false, true, true}, epState{"s2", true, true, false}, epState{"s3", true, true, false}))
	select {
	case err := <-during:
		t.Fatalf("the connections ended before the endpoints changed (%v): nothing checked", err)
	default:
	}
	waitMetrics("s1 terminating, s2 and s3 ready", func(m map[string]float64) bool {
		return m["eztunnel_services_sync_seconds_count"] > n && m["eztunnel_services_backend_slots"] == s0+4
	})
	waitKubeProxy(t, svcPort, ep("s2"), ep("s3"))
	if err := <-during; err != nil {
		t.Errorf("connections while s3 was added and s1 began terminating: %v", err)
	}
	kubectl(t, "-n", ns, "delete", "pod", "s1", "--wait=true", "--timeout=60s")
	both("s1 terminating and deleted", true)

	// 3: no ready endpoint: the serving terminating one is used (s3).
	n = syncs()
	updateSlice(slice(epState{"s2", false, false, false}, epState{"s3", false, true, true}))
	waitMetrics("only s3, serving and terminating", func(m map[string]float64) bool {
		return m["eztunnel_services_sync_seconds_count"] > n && m["eztunnel_services_backend_slots"] == s0+2
	})
	waitKubeProxy(t, svcPort, ep("s3"))
	both("only a serving terminating endpoint", true)

	// eztunnelBackends waits until eztunnel's frontend for the ClusterIP
	// (eztunnelBackendsOf: for vip) holds exactly want (read from the
	// pinned maps: `eztunnel services`).
	var eztunnelBackendsOf func(what, vip string, want ...string)
	eztunnelBackends := func(what string, want ...string) { eztunnelBackendsOf(what, vip, want...) }
	eztunnelBackendsOf = func(what, vip string, want ...string) {
		t.Helper()
		slices.Sort(want)
		var got []string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			out, err := sysexec.Command(ctx, filepath.Join(workDir, "eztunnel"), "services", "--pin-path", svcPin, "-o", "json").Output()
			if err != nil {
				t.Fatalf("%s: eztunnel services: %v", what, err)
			}
			var fes []struct {
				Frontend string   `json:"frontend"`
				Backends []string `json:"backends"`
			}
			if err := json.Unmarshal(out, &fes); err != nil {
				t.Fatalf("%s: eztunnel services: %v: %s", what, err, out)
			}
			got = nil
			for _, f := range fes {
				if f.Frontend == vip+"/TCP" {
					got = f.Backends
				}
			}
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: eztunnel's backends of %s: %v, want %v (kube-proxy's)", what, vip, got, want)
			}
		}
	}

	// 3b: topology. The node is in zone-a; with every ready endpoint
	// hinted, kube-proxy and eztunnel keep the zone's (s2) only. Then
	// internalTrafficPolicy Local: the node's endpoints only (s3 is said to
	// be on another node).
	const zoneLabel = "topology.kubernetes.io/zone"
	kubectl(t, "label", "node", k8scluster.NodeName, zoneLabel+"=zone-a", "--overwrite")
	t.Cleanup(func() {
		cl.Kubectl(context.Background(), "label", "node", k8scluster.NodeName, zoneLabel+"-")
	})
	hinted := slice(epState{"s2", true, true, false}, epState{"s3", true, true, false})
	hinted.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}}
	hinted.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	updateSlice(hinted)
	waitKubeProxy(t, svcPort, ep("s2"))
	eztunnelBackends("zone hints", ep("s2"))
	both("zone hints", true)
	// A hint for the node's zone missing: no topology, both endpoints.
	hinted = slice(epState{"s2", true, true, false}, epState{"s3", true, true, false})
	hinted.Endpoints[0].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-c"}}}
	hinted.Endpoints[1].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}}}
	updateSlice(hinted)
	waitKubeProxy(t, svcPort, ep("s2"), ep("s3"))
	eztunnelBackends("no hint for the node's zone", ep("s2"), ep("s3"))

	local := slice(epState{"s2", true, true, false}, epState{"s3", true, true, false})
	local.Endpoints[0].NodeName = ptr.To(k8scluster.NodeName)
	local.Endpoints[1].NodeName = ptr.To("elsewhere")
	updateSlice(local)
	svc, err = cs.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	if svc, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitKubeProxy(t, svcPort, ep("s2"))
	eztunnelBackends("internalTrafficPolicy Local", ep("s2"))
	both("internalTrafficPolicy Local", true)
	svc.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyCluster)
	if svc, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitKubeProxy(t, svcPort, ep("s2"), ep("s3"))
	eztunnelBackends("internalTrafficPolicy Cluster again", ep("s2"), ep("s3"))

	// 3c: an ExternalIP and the load-balancer IPs of a LoadBalancer
	// Service: frontends of the cluster's endpoints (as kube-proxy routes a
	// pod's traffic to them); an IP of ipMode Proxy is left to the load
	// balancer and counted. A pod reaches them through eztunnel.
	const extIP, lbIP, proxyIP = "192.0.2.10", "198.51.100.7", "198.51.100.9"
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{extIP}
	if svc, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP}, {IP: proxyIP, IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
	if svc, err = cs.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{extIP, lbIP} {
		eztunnelBackendsOf("external "+ip, net.JoinHostPort(ip, "80"), ep("s2"), ep("s3"))
		out, err := cl.Kubectl(ctx, "-n", ns, "exec", "c", "-c", "w", "--", "/eztunnel-lab", "workload", "stream", "--addr", net.JoinHostPort(ip, "80"),
			"--conns", "8", "--up", "65536", "--down", "65536", "--seed", "7")
		var rep workload.StreamReport
		if jerr := json.Unmarshal(out, &rep); err != nil || jerr != nil || rep.Conns != 8 || len(rep.Failures) > 0 {
			t.Errorf("a pod to %s: %v %v %+v", ip, err, jerr, rep)
		}
	}
	eztunnelBackendsOf("ipMode Proxy", net.JoinHostPort(proxyIP, "80")) // none
	waitMetrics("the Proxy-mode IP counted", func(m map[string]float64) bool { return m[`eztunnel_services_skipped{reason="lb_proxy"}`] == 1 })
	svc.Spec.Type, svc.Spec.ExternalIPs = corev1.ServiceTypeClusterIP, nil
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].NodePort = 0
	}
	if svc, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eztunnelBackendsOf("ExternalIP removed", net.JoinHostPort(extIP, "80"))

	// 4: no endpoints: the same connect error both ways.
	n = syncs()
	updateSlice(slice())
	waitMetrics("no endpoints", func(m map[string]float64) bool {
		return m["eztunnel_services_sync_seconds_count"] > n && m["eztunnel_services_backend_slots"] == s0
	})
	waitKubeProxy(t, svcPort)
	refused0 := metricsNow()[`eztunnel_services_failures_total{reason="no_backend"}`]
	pod, host := both("no endpoints", false)
	if len(pod.Failures) != 16 || len(host.Failures) != 16 || pod.Failures[0].Error != host.Failures[0].Error {
		t.Errorf("no endpoints: through eztunnel %+v; through kube-proxy %+v", pod, host)
	} else {
		t.Logf("no endpoints: both fail with %q", pod.Failures[0].Error)
	}
	if r := metricsNow()[`eztunnel_services_failures_total{reason="no_backend"}`]; r-refused0 != 16 {
		t.Errorf("%v connects refused for no backend, want 16", r-refused0)
	}

	// A Service the datapath cannot serve (SCTP; last: kube-proxy's rules
	// for it need a kernel module) is counted as skipped while it exists,
	// and the agent goes on.
	if _, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sctp"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "s", Port: 9, Protocol: corev1.ProtocolSCTP,
			TargetPort: intstr.FromInt32(9)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitMetrics("SCTP Service skipped", func(m map[string]float64) bool {
		return m[`eztunnel_services_skipped{reason="protocol"}`] == 1 && m["eztunnel_services_frontends"] == f0+2
	})

	// A LoadBalancer Service with externalTrafficPolicy Local: its
	// healthCheckNodePort answers as kube-proxy's does (status, endpoint
	// weight, body), with a local ready endpoint and without.
	lbSvc, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lb"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports: []corev1.ServicePort{{Name: "stream", Port: 8080, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(7000)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hcPort := strconv.Itoa(int(lbSvc.Spec.HealthCheckNodePort))
	lbSlice := func(readyHere bool) *discoveryv1.EndpointSlice {
		sl := slice(epState{"s2", readyHere, true, !readyHere}, epState{"s3", true, true, false})
		sl.Name, sl.Labels[discoveryv1.LabelServiceName] = "lb-1", "lb"
		sl.Ports = sl.Ports[:1]
		sl.Endpoints[0].NodeName = ptr.To(k8scluster.NodeName)
		sl.Endpoints[1].NodeName = ptr.To("elsewhere")
		return sl
	}
	setSlice(lbSlice(true), true)
	type hcAnswer struct{ code, weight, body string }
	askHC := func(host string) hcAnswer {
		c := &http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get("http://" + net.JoinHostPort(host, hcPort) + "/")
		if err != nil {
			return hcAnswer{code: err.Error()}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return hcAnswer{strconv.Itoa(resp.StatusCode), resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), string(b)}
	}
	sameHC := func(what, wantCode string) {
		t.Helper()
		var kp, ez hcAnswer
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			kp, ez = askHC(k8scluster.NodeIP), askHC("127.0.0.1")
			if kp.code == wantCode && kp == ez {
				t.Logf("%s: both answer %s, weight %s", what, kp.code, kp.weight)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: healthCheckNodePort %s: kube-proxy %+v, eztunnel %+v (want %s from both, the same)", what, hcPort, kp, ez, wantCode)
			}
		}
	}
	sameHC("a local ready endpoint", "200")
	updateSlice(lbSlice(false))
	sameHC("the local endpoint terminating", "503")

	// 5: the Services deleted: their frontends go.
	for _, name := range []string{"web", "sctp", "lb"} {
		if err := cs.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitMetrics("Services deleted", func(m map[string]float64) bool {
		return m["eztunnel_services_frontends"] == f0 && m["eztunnel_services_backend_slots"] == s0 &&
			m[`eztunnel_services_skipped{reason="protocol"}`] == 0
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", hcPort), time.Second); err != nil {
			break // the health check port closed with its Service
		}
		if time.Now().After(deadline) {
			t.Fatalf("eztunnel's healthCheckNodePort %s still open after the Service was deleted", hcPort)
		}
	}
	if s := metricsNow()[`eztunnel_services_skipped{reason="protocol"}`]; s != 0 {
		t.Errorf("skipped parts: %v", s)
	}

	ag.stop()
}

// svcAgent is `eztunnel run --services` on the host, attached to the pods'
// root cgroup, fed by the cluster's API server and pinned at pin. It can be
// stopped and started again (a restart); it is stopped and uninstalled when
// the test ends (its log printed if the test failed).
type svcAgent struct {
	t           testing.TB
	pin         string
	args        []string // beyond the ones every services agent gets
	kubernetes  bool     // Kubernetes mode (--kubernetes at the pods' root) instead of --cgroup
	cmd         *exec.Cmd
	logs        *logbuf.Buffer
	metricsAddr string
}

// newSvcAgent prepares the agent; start runs it.
func newSvcAgent(t testing.TB, pin string, args ...string) *svcAgent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &svcAgent{t: t, pin: pin, args: args, logs: &logbuf.Buffer{}, metricsAddr: ln.Addr().String()}
	ln.Close()
	t.Cleanup(func() {
		if a.cmd != nil {
			a.cmd.Process.Kill()
			a.cmd.Wait()
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := sysexec.Command(ctx, filepath.Join(workDir, "eztunnel"), "uninstall", "--pin-path", pin, "--drain-timeout", "1s").CombinedOutput()
		if t.Failed() || err != nil {
			t.Logf("agent log:\n%s", a.logs.String())
		}
		if err != nil { // after the log: a CI excerpt ends here
			t.Errorf("uninstall: %v\n%s", err, out)
		}
	})
	return a
}

// startSvcAgent is newSvcAgent, started.
func startSvcAgent(t testing.TB, pin string, args ...string) *svcAgent {
	a := newSvcAgent(t, pin, args...)
	a.start()
	return a
}

// start runs the agent and waits until it is ready.
func (a *svcAgent) start() {
	a.t.Helper()
	ready := filepath.Join(a.t.TempDir(), "ready")
	scope := []string{"--cgroup", podsCgroup()}
	if a.kubernetes {
		scope = []string{"--kubernetes", "--pods-cgroup", podsCgroup()}
	}
	a.cmd = sysexec.Command(context.Background(), filepath.Join(workDir, "eztunnel"), append(append([]string{"run"}, scope...), append([]string{"--pin-path", a.pin,
		"--adopt=false", "--services", "--kubeconfig", cl.Kubeconfig, "--node-name", k8scluster.NodeName,
		"--metrics-addr", a.metricsAddr, "--ready-file", ready}, a.args...)...)...)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := os.Stat(ready); err == nil {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("agent not ready after a minute:\n%s", a.logs.String())
		}
	}
}

// stop ends the agent with SIGTERM; it must exit cleanly.
func (a *svcAgent) stop() {
	a.t.Helper()
	a.cmd.Process.Signal(syscall.SIGTERM)
	err := a.cmd.Wait()
	a.cmd = nil
	if err != nil {
		a.t.Fatalf("agent exit: %v", err)
	}
}

func (a *svcAgent) metrics() map[string]float64 {
	a.t.Helper()
	return metricsAt(a.t, a.metricsAddr)
}
