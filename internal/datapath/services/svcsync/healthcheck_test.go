package svcsync

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// TestHealthCheckOn: only LoadBalancer Services with externalTrafficPolicy
// Local have one; it counts the node's ready endpoints by address.
func TestHealthCheckOn(t *testing.T) {
	web := kubeapi.ServicePort{Name: "web", Port: 80, Protocol: kubeapi.ProtocolTCP, NodePort: 30080}
	s := svc("a", []string{"10.96.0.1"}, web)
	s.Spec.Type = kubeapi.ServiceTypeLoadBalancer
	s.Spec.HealthCheckNodePort = 32000
	sl := slice("a", kubeapi.AddressTypeIPv4, "web", 8080, ep{addr: "10.0.0.1"}, ep{addr: "10.0.0.2"},
		ep{addr: "10.0.0.3", ready: ptr.To(false), serving: ptr.To(true), terminate: ptr.To(true)}, ep{addr: "10.0.0.4"})
	other := slice("a", kubeapi.AddressTypeIPv4, "dns", 5353, ep{addr: "10.0.0.1"}) // same pod, another port
	for i, n := range []string{"n1", "n2", "n1", "n1"} {
		sl.Endpoints[i].NodeName = ptr.To(n)
	}
	other.Endpoints[0].NodeName = ptr.To("n1")
	sls := []*kubeapi.EndpointSlice{sl, other}
	if _, ok := HealthCheckOn(s, sls, "n1"); ok {
		t.Errorf("externalTrafficPolicy Cluster has a health check")
	}
	s.Spec.ExternalTrafficPolicy = kubeapi.ServiceExternalTrafficPolicyLocal
	if hc, ok := HealthCheckOn(s, sls, "n1"); !ok || hc.Port != 32000 || hc.LocalEndpoints != 2 {
		t.Errorf("Local on n1: %+v %v, want port 32000 and 2 endpoints (10.0.0.1 once, 10.0.0.4; not the terminating one)", hc, ok)
	}
	if hc, _ := HealthCheckOn(s, sls, "n3"); hc.LocalEndpoints != 0 {
		t.Errorf("Local on n3: %+v", hc)
	}
	s.Spec.Type = kubeapi.ServiceTypeNodePort
	if _, ok := HealthCheckOn(s, sls, "n1"); ok {
		t.Errorf("a NodePort Service has a health check")
	}
}

// TestHealthServer: the answers of kube-proxy's health check server, the
// count updated in place, the port closed with the Service.
func TestHealthServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	h := NewHealthServer([]string{"127.0.0.1"}, nil)
	defer h.Close()
	get := func() (int, string, string) {
		t.Helper()
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(int(port)) + "/")
		if err != nil {
			return 0, "", err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), string(b)
	}
	h.Set("ns/web", &HealthCheck{Port: port, LocalEndpoints: 2})
	code, weight, body := get()
	want := "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
	if code != 200 || weight != "2" || body != want {
		t.Errorf("2 local endpoints: %d %q %q, want 200, 2, %q", code, weight, body, want)
	}
	var v struct{ LocalEndpoints int }
	if json.Unmarshal([]byte(body), &v) != nil || v.LocalEndpoints != 2 {
		t.Errorf("body is not the JSON kube-proxy sends: %q", body)
	}
	h.Set("ns/web", &HealthCheck{Port: port, LocalEndpoints: 0})
	if code, weight, _ := get(); code != 503 || weight != "0" {
		t.Errorf("no local endpoint: %d %q, want 503, 0", code, weight)
	}
	if ports, failed := h.Ports(); ports["ns/web"] != port || failed != 0 {
		t.Errorf("ports %v, failed %d", ports, failed)
	}
	// Another Service wanting the port: it cannot be served, and says so.
	h.Set("ns/other", &HealthCheck{Port: port, LocalEndpoints: 1})
	if _, failed := h.Ports(); failed != 1 {
		t.Errorf("a second listener on the port: %d failures, want 1", failed)
	}
	h.Set("ns/other", nil)
	h.Set("ns/web", nil)
	if code, _, _ := get(); code != 0 {
		t.Errorf("after the Service went: still answered %d", code)
	}
	h.Close()
	h.Set("ns/web", &HealthCheck{Port: port, LocalEndpoints: 1})
	if code, _, _ := get(); code != 0 {
		t.Errorf("after Close: answered %d", code)
	}
}
