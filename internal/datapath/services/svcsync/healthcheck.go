package svcsync

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/tools/cache"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// HealthCheck is a Service's healthCheckNodePort as kube-proxy serves it
// (pkg/proxy/healthcheck, v1.33): a LoadBalancer Service with
// externalTrafficPolicy Local has one, and load balancers send traffic only
// to the nodes that answer 200 there, those with a local ready endpoint.
type HealthCheck struct {
	Port uint16
	// LocalEndpoints: distinct addresses of the node's ready endpoints, all
	// ports and families of the Service together (serving terminating ones
	// do not count: the node should stop getting new traffic).
	LocalEndpoints int
}

// HealthCheckOn is svc's health check on node, if it has one.
func HealthCheckOn(svc *kubeapi.Service, slices []*kubeapi.EndpointSlice, node string) (HealthCheck, bool) {
	if svc == nil || svc.Spec.Type != kubeapi.ServiceTypeLoadBalancer || svc.Spec.ExternalTrafficPolicy != kubeapi.ServiceExternalTrafficPolicyLocal ||
		svc.Spec.HealthCheckNodePort <= 0 || svc.Spec.HealthCheckNodePort > 65535 {
		return HealthCheck{}, false
	}
	local := map[netip.Addr]bool{}
	for _, sl := range slices {
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) == 0 || node == "" || ep.NodeName == nil || *ep.NodeName != node {
				continue
			}
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			if a, err := netip.ParseAddr(ep.Addresses[0]); err == nil {
				local[a.Unmap()] = true
			}
		}
	}
	return HealthCheck{Port: uint16(svc.Spec.HealthCheckNodePort), LocalEndpoints: len(local)}, true
}

// HealthServer serves the health checks of the node's Services, one HTTP
// listener per port on each of its addresses, answering as kube-proxy
// does: 200 with a local endpoint, else 503; the body names the Service and
// the count, X-Load-Balancing-Endpoint-Weight too. serviceProxyHealthy is
// true: the listeners live as long as the agent's source runs.
type HealthServer struct {
	addrs []string // listen hosts ("" or "::": every address)
	log   *slog.Logger

	mu     sync.Mutex
	checks map[string]*hcServer // by Service (namespace/name)
	failed int                  // listeners that could not be opened
	closed bool
}

type hcServer struct {
	port  uint16
	count int
	srvs  []*http.Server
}

// NewHealthServer listens on addrs (hosts; empty: every address of the
// node).
func NewHealthServer(addrs []string, log *slog.Logger) *HealthServer {
	if len(addrs) == 0 {
		addrs = []string{""}
	}
	if log == nil {
		log = slog.Default()
	}
	return &HealthServer{addrs: addrs, log: log, checks: map[string]*hcServer{}}
}

// Set makes key's health check hc (nil: none); a new port is listened on
// at once, an unchanged one only gets the new count.
func (h *HealthServer) Set(key string, hc *HealthCheck) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return // a Service applied while the agent stops
	}
	cur := h.checks[key]
	if cur != nil && (hc == nil || hc.Port != cur.port) {
		cur.close()
		delete(h.checks, key)
		cur = nil
	}
	if hc == nil {
		return
	}
	if cur != nil {
		cur.count = hc.LocalEndpoints
		return
	}
	s := &hcServer{port: hc.Port, count: hc.LocalEndpoints}
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	for _, host := range h.addrs {
		addr := net.JoinHostPort(host, strconv.Itoa(int(hc.Port)))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			h.failed++
			h.log.Warn("services: cannot serve a healthCheckNodePort", "service", key, "addr", addr, "err", err)
			continue
		}
		srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			h.mu.Lock()
			count := s.count
			h.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
			if count != 0 {
				w.WriteHeader(http.StatusOK)
			} else {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": true\n}", ns, name, count)
		})}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.log.Warn("services: healthCheckNodePort server", "service", key, "err", err)
			}
		}()
		s.srvs = append(s.srvs, srv)
	}
	h.checks[key] = s
}

func (s *hcServer) close() {
	for _, srv := range s.srvs {
		srv.Close() // under HealthServer.mu: no waiting for handlers, which take it
	}
}

// Ports are the health check ports served (or tried), by Service, and
// how many listeners could not be opened.
func (h *HealthServer) Ports() (map[string]uint16, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]uint16, len(h.checks))
	for k, s := range h.checks {
		out[k] = s.port
	}
	return out, h.failed
}

// Close stops every listener.
func (h *HealthServer) Close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for k, s := range h.checks {
		s.close()
		delete(h.checks, k)
	}
}
