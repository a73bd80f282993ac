package svcsync

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Metrics are the eztunnel_services_* metrics: what the Service load
// balancer's table did (svcsync.Recorder) and its datapath's counters.
type Metrics struct {
	mu                  sync.Mutex
	frontends, backends int
	skipped             map[string]int
	// Pods left to their proxy, and pods whose choice does not parse.
	proxied, invalidChoices int
	sync                    prometheus.Histogram
	counters                func() (bpfsys.Counters, error)
	skipReasons             []string // always reported, 0 or not

	descFrontends, descBackends, descTranslations, descReversed, descFailures, descUp, descSkipped, descAffinity, descDestroyed *prometheus.Desc
	descProxied, descInvalidChoice, descLeftToProxy                                                                             *prometheus.Desc
}

// NewMetrics reads the datapath's counters through counters (nil: none);
// skipReasons are the skip reasons always reported (svcsync.SkipReasons).
func NewMetrics(counters func() (bpfsys.Counters, error), skipReasons []string) *Metrics {
	const ns = "eztunnel_services_"
	return &Metrics{
		counters: counters, skipReasons: skipReasons,
		sync: prometheus.NewHistogram(prometheus.HistogramOpts{Name: ns + "sync_seconds",
			Help:    "From a Service or EndpointSlice change seen (informer event, file read) to its frontends written in the maps.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
		descFrontends: prometheus.NewDesc(ns+"frontends", "Frontends (ClusterIP, ExternalIP or load-balancer IP:port:protocol, and NodePorts) written.", nil, nil),
		descBackends:  prometheus.NewDesc(ns+"backend_slots", "Backend slots written, all frontends together.", nil, nil),
		descTranslations: prometheus.NewDesc(ns+"translations_total",
			"Sockets or flows translated to a backend: kind tcp_connect, udp_connect, udp_send (unconnected datagrams), nodeport (NodePort flows set up at tc).", []string{"kind"}, nil),
		descReversed: prometheus.NewDesc(ns+"reverse_translations_total",
			"Backend addresses shown as the frontend: kind recv (UDP sources), peer (getpeername), original_dst (SO_ORIGINAL_DST asked by a proxy that intercepted the connection).", []string{"kind"}, nil),
		descFailures: prometheus.NewDesc(ns+"failures_total",
			"Datapath failures by reason: no_backend (refused), backend_miss (raced an update), no_storage (no reverse entry), udp_repick (backend gone, chose again), orig_full (a translated connection not recorded for SO_ORIGINAL_DST: map full), nodeport_no_backend (a NodePort flow without (local) backend left to the kernel path), nodeport_not_new (a packet of no known flow that cannot start one), nodeport_ct_failed (the flow's conntrack entry not made).", []string{"reason"}, nil),
		descAffinity: prometheus.NewDesc(ns+"affinity_hits_total",
			"Sockets sent to the backend their client (network namespace) had, by sessionAffinity ClientIP.", nil, nil),
		descDestroyed: prometheus.NewDesc(ns+"sockets_destroyed_total",
			"Sockets destroyed because the backend they were translated to left the frontend (TCP: aborted; connected UDP), by proto.", []string{"proto"}, nil),
		descProxied: prometheus.NewDesc(ns+"proxied_pods",
			"Pods left to their proxy (eztunnel.io/services: proxy or proxy:<uid>; the file's proxied entries): their TCP connects to ClusterIPs are not translated at the socket, their proxy's are.", nil, nil),
		descInvalidChoice: prometheus.NewDesc(ns+"pod_choice_invalid",
			"Pods whose eztunnel.io/services annotation does not parse: they keep the default (translated at the socket).", nil, nil),
		descLeftToProxy: prometheus.NewDesc(ns+"left_to_proxy_total",
			"TCP connects to a frontend by a pod left to its proxy (not by its proxy), not translated.", nil, nil),
		descUp: prometheus.NewDesc(ns+"up", "1 when the load balancer's counters could be read.", nil, nil),
		descSkipped: prometheus.NewDesc(ns+"skipped",
			"Parts of the current Services not translated, by reason: no_ports, protocol (not TCP/UDP), family (not served by the node), bad_address, conflict (frontend of another Service), write_failed, lb_proxy (a load-balancer IP of ipMode Proxy, left to the load balancer as kube-proxy does).", []string{"reason"}, nil),
	}
}

// Synced observes the time from a change seen to its frontends written.
func (m *Metrics) Synced(d time.Duration) { m.sync.Observe(d.Seconds()) }

// SetState takes the table's totals: frontends, backend slots, and the
// parts not written by reason.
func (m *Metrics) SetState(frontends, backends int, skipped map[string]int) {
	m.mu.Lock()
	m.frontends, m.backends, m.skipped = frontends, backends, skipped
	m.mu.Unlock()
}

// SetProxied takes the pods left to their proxy and those whose choice
// does not parse.
func (m *Metrics) SetProxied(proxied, invalid int) {
	m.mu.Lock()
	m.proxied, m.invalidChoices = proxied, invalid
	m.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.sync.Describe(ch)
	for _, d := range []*prometheus.Desc{m.descFrontends, m.descBackends, m.descTranslations, m.descReversed, m.descFailures, m.descUp, m.descSkipped, m.descAffinity, m.descDestroyed,
		m.descProxied, m.descInvalidChoice, m.descLeftToProxy} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.sync.Collect(ch)
	m.mu.Lock()
	ch <- prometheus.MustNewConstMetric(m.descFrontends, prometheus.GaugeValue, float64(m.frontends))
	ch <- prometheus.MustNewConstMetric(m.descBackends, prometheus.GaugeValue, float64(m.backends))
	for _, r := range m.skipReasons {
		ch <- prometheus.MustNewConstMetric(m.descSkipped, prometheus.GaugeValue, float64(m.skipped[r]), r)
	}
	ch <- prometheus.MustNewConstMetric(m.descProxied, prometheus.GaugeValue, float64(m.proxied))
	ch <- prometheus.MustNewConstMetric(m.descInvalidChoice, prometheus.GaugeValue, float64(m.invalidChoices))
	m.mu.Unlock()
	if m.counters == nil {
		return
	}
	c, err := m.counters()
	up := 1.0
	if err != nil {
		up = 0
	} else {
		for _, k := range []string{"tcp_connect", "udp_connect", "udp_send"} {
			ch <- prometheus.MustNewConstMetric(m.descTranslations, prometheus.CounterValue, float64(c[k]), k)
		}
		ch <- prometheus.MustNewConstMetric(m.descTranslations, prometheus.CounterValue, float64(c["nodeport_new"]), "nodeport")
		ch <- prometheus.MustNewConstMetric(m.descAffinity, prometheus.CounterValue, float64(c["affinity_hit"]))
		ch <- prometheus.MustNewConstMetric(m.descLeftToProxy, prometheus.CounterValue, float64(c["left_to_proxy"]))
		ch <- prometheus.MustNewConstMetric(m.descReversed, prometheus.CounterValue, float64(c["recv_reversed"]), "recv")
		ch <- prometheus.MustNewConstMetric(m.descReversed, prometheus.CounterValue, float64(c["peer_reversed"]), "peer")
		ch <- prometheus.MustNewConstMetric(m.descReversed, prometheus.CounterValue, float64(c["orig_dst"]), "original_dst")
		for _, k := range []string{"no_backend", "backend_miss", "no_storage", "udp_repick", "orig_full", "nodeport_no_backend", "nodeport_not_new", "nodeport_ct_failed"} {
			ch <- prometheus.MustNewConstMetric(m.descFailures, prometheus.CounterValue, float64(c[k]), k)
		}
		ch <- prometheus.MustNewConstMetric(m.descDestroyed, prometheus.CounterValue, float64(c["destroyed_tcp"]), "tcp")
		ch <- prometheus.MustNewConstMetric(m.descDestroyed, prometheus.CounterValue, float64(c["destroyed_udp"]), "udp")
	}
	ch <- prometheus.MustNewConstMetric(m.descUp, prometheus.GaugeValue, up)
}
