package metrics

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// Pod is a selected pod and its pod-level cgroup.
type Pod struct {
	Namespace, Name string
	CgroupID        uint64
	CgroupPath      string // its pod-level cgroup v2 directory (containers are below it)
}

// PodSource lists the selected pods and reads the datapath's per-cgroup counts.
type PodSource interface {
	Pods() []Pod
	ReadScope() (map[uint64]uint64, error)
}

// PodCollector exports per-pod counts in Kubernetes mode. Label cardinality
// is bounded by the pods selected on this node (at most the size of
// ez_sc_cgroups); a deselected pod's series disappear.
type PodCollector struct {
	src      PodSource
	selected *prometheus.Desc
	enrolled *prometheus.Desc
}

// NewPodCollector describes the per-pod metrics.
func NewPodCollector(src PodSource) *PodCollector {
	return &PodCollector{
		src: src,
		selected: prometheus.NewDesc(namespace+"_pods_selected",
			"Pods of this node selected for acceleration.", nil, nil),
		enrolled: prometheus.NewDesc(namespace+"_pod_sockets_enrolled_total",
			"Sockets of a selected pod enrolled in the socket shortcut since the pod was selected.", []string{"namespace", "pod"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *PodCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.selected
	ch <- c.enrolled
}

// Collect implements prometheus.Collector.
func (c *PodCollector) Collect(ch chan<- prometheus.Metric) {
	pods := c.src.Pods()
	ch <- prometheus.MustNewConstMetric(c.selected, prometheus.GaugeValue, float64(len(pods)))
	counts, err := c.src.ReadScope()
	if err != nil {
		slog.Warn("metrics: reading per-pod counts", "err", err)
		return
	}
	for _, p := range pods {
		if n, ok := counts[p.CgroupID]; ok {
			ch <- prometheus.MustNewConstMetric(c.enrolled, prometheus.CounterValue, float64(n), p.Namespace, p.Name)
		}
	}
}
