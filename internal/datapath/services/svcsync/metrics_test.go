package svcsync

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// TestServicesCollector: the table's state and the datapath's counters
// become the eztunnel_services_* metrics, every skip reason reported, and
// eztunnel_services_up says whether the counters could be read; promlint
// finds nothing.
func TestServicesCollector(t *testing.T) {
	var fail bool
	m := NewMetrics(func() (bpfsys.Counters, error) {
		if fail {
			return nil, errors.New("closed")
		}
		return bpfsys.Counters{"tcp_connect": 7, "nodeport_new": 3, "no_backend": 2, "destroyed_udp": 1}, nil
	}, []string{"no_ports", "conflict"})
	m.SetState(4, 9, map[string]int{"conflict": 1})
	m.SetProxied(2, 1)
	m.Synced(3 * time.Millisecond)
	want := `
# HELP eztunnel_services_frontends Frontends (ClusterIP, ExternalIP or load-balancer IP:port:protocol, and NodePorts) written.
# TYPE eztunnel_services_frontends gauge
eztunnel_services_frontends 4
# HELP eztunnel_services_proxied_pods Pods left to their proxy (eztunnel.io/services: proxy or proxy:<uid>; the file's proxied entries): their TCP connects to ClusterIPs are not translated at the socket, their proxy's are.
# TYPE eztunnel_services_proxied_pods gauge
eztunnel_services_proxied_pods 2
# HELP eztunnel_services_skipped Parts of the current Services not translated, by reason: no_ports, protocol (not TCP/UDP), family (not served by the node), bad_address, conflict (frontend of another Service), write_failed, lb_proxy (a load-balancer IP of ipMode Proxy, left to the load balancer as kube-proxy does).
# TYPE eztunnel_services_skipped gauge
eztunnel_services_skipped{reason="conflict"} 1
eztunnel_services_skipped{reason="no_ports"} 0
# HELP eztunnel_services_up 1 when the load balancer's counters could be read.
# TYPE eztunnel_services_up gauge
eztunnel_services_up 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "eztunnel_services_frontends", "eztunnel_services_proxied_pods",
		"eztunnel_services_skipped", "eztunnel_services_up"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, "eztunnel_services_sync_seconds"); n != 1 {
		t.Errorf("%d sync histograms, want 1", n)
	}
	if n := testutil.CollectAndCount(m, "eztunnel_services_translations_total"); n != 4 {
		t.Errorf("%d translation kinds, want 4", n)
	}
	if problems, err := testutil.CollectAndLint(m); err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
	fail = true
	if err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP eztunnel_services_up 1 when the load balancer's counters could be read.
# TYPE eztunnel_services_up gauge
eztunnel_services_up 0
`), "eztunnel_services_up"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(m, "eztunnel_services_translations_total"); n != 0 {
		t.Errorf("counters unreadable: %d translation series, want none", n)
	}
}
