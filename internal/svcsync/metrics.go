package svcsync

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

// Metrics are the eztunnel_services_* metrics. A nil *Metrics counts nothing.
type Metrics struct {
	mu                  sync.Mutex
	frontends, backends int
	skipped             *prometheus.CounterVec
	sync                prometheus.Histogram
	counters            func() (lb.Counters, error)

	descFrontends, descBackends, descTranslations, descReversed, descFailures, descUp *prometheus.Desc
}

// NewMetrics reads the datapath's counters through counters (nil: none).
func NewMetrics(counters func() (lb.Counters, error)) *Metrics {
	const ns = "eztunnel_services_"
	return &Metrics{
		counters: counters,
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: ns + "skipped_total",
			Help: "Service frontends skipped, by reason (no_ports, protocol, family, bad_address, conflict, write_failed)."}, []string{"reason"}),
		sync: prometheus.NewHistogram(prometheus.HistogramOpts{Name: ns + "sync_seconds",
			Help:    "From a Service or EndpointSlice change seen (informer event, file read) to its frontends written in the maps.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}),
		descFrontends: prometheus.NewDesc(ns+"frontends", "Frontends (ClusterIP:port:protocol) written.", nil, nil),
		descBackends:  prometheus.NewDesc(ns+"backend_slots", "Backend slots written, all frontends together.", nil, nil),
		descTranslations: prometheus.NewDesc(ns+"translations_total",
			"Sockets translated to a backend: kind tcp_connect, udp_connect, udp_send (unconnected datagrams).", []string{"kind"}, nil),
		descReversed: prometheus.NewDesc(ns+"reverse_translations_total",
			"Backend addresses shown as the frontend: kind recv (UDP sources), peer (getpeername).", []string{"kind"}, nil),
		descFailures: prometheus.NewDesc(ns+"failures_total",
			"Datapath failures by reason: no_backend (refused), backend_miss (raced an update), no_storage (no reverse entry), udp_repick (backend gone, chose again).", []string{"reason"}, nil),
		descUp: prometheus.NewDesc(ns+"up", "1 when the load balancer's counters could be read.", nil, nil),
	}
}

func (m *Metrics) skip(reason string) {
	if m != nil {
		m.skipped.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) synced(d time.Duration) {
	if m != nil {
		m.sync.Observe(d.Seconds())
	}
}

func (m *Metrics) setState(frontends, backends int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.frontends, m.backends = frontends, backends
	m.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.skipped.Describe(ch)
	m.sync.Describe(ch)
	for _, d := range []*prometheus.Desc{m.descFrontends, m.descBackends, m.descTranslations, m.descReversed, m.descFailures, m.descUp} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.skipped.Collect(ch)
	m.sync.Collect(ch)
	m.mu.Lock()
	ch <- prometheus.MustNewConstMetric(m.descFrontends, prometheus.GaugeValue, float64(m.frontends))
	ch <- prometheus.MustNewConstMetric(m.descBackends, prometheus.GaugeValue, float64(m.backends))
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
		ch <- prometheus.MustNewConstMetric(m.descReversed, prometheus.CounterValue, float64(c["recv_reversed"]), "recv")
		ch <- prometheus.MustNewConstMetric(m.descReversed, prometheus.CounterValue, float64(c["peer_reversed"]), "peer")
		for _, k := range []string{"no_backend", "backend_miss", "no_storage", "udp_repick"} {
			ch <- prometheus.MustNewConstMetric(m.descFailures, prometheus.CounterValue, float64(c[k]), k)
		}
	}
	ch <- prometheus.MustNewConstMetric(m.descUp, prometheus.GaugeValue, up)
}

// Skipped is how many frontends were skipped for reason.
func (m *Metrics) Skipped(reason string) float64 {
	var d dto.Metric
	if err := m.skipped.WithLabelValues(reason).Write(&d); err != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}
