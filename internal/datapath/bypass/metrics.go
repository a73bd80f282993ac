package bypass

import (
	"log/slog"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// The metrics' namespace and the counters' fallback prefix, as
// internal/metrics names them (this package cannot import it: it imports
// the datapath).
const (
	namespace      = "eztunnel"
	fallbackPrefix = "fallback_"
)

// source reads the bridge bypass the agent runs (a *Node).
type source interface {
	BypassCounters() (map[string]uint64, error)
	BypassState() (devices, endpoints int)
	// BypassStandbyKind says why the bypass, loaded, is attached nowhere
	// now (it could not act: conntrack does not run), as one of
	// StandbyKinds; "" while it is not standing by. The prose is in the log
	// and `eztunnel status`.
	BypassStandbyKind() string
	// BypassIdleKinds: devices it could take but does not attach to,
	// because it could not act there, or must not (another owner's traffic
	// control on it, a pod's bandwidth annotation), each with its reason's
	// kind (IdleKinds).
	BypassIdleKinds() map[string]string
}

// managedNeighbourSource is a source that keeps managed neighbour
// entries for the node's pods (Kubernetes mode); ok false: none kept.
type managedNeighbourSource interface {
	BypassManagedNeighbours() (n int, ok bool)
}

// idleDevicesHelp is eztunnel_bypass_idle_devices's help; its reasons are
// IdleKinds.
const idleDevicesHelp = "Pod veths and uplinks the bridge bypass does not attach to, by reason: no_endpoint (no pod address learnt yet), uplink_down, qdisc (another owner's qdisc on the transmit side, e.g. the bandwidth CNI plugin's tbf), tc_filter, tcx_program (another owner's, which a redirect would skip), tc_unreadable, bandwidth_annotation (a pod with kubernetes.io/ingress-bandwidth or egress-bandwidth); 0 for a reason no device has."

// The kinds of standby (the reason label of eztunnel_bypass_standby).
const (
	standbyKindConntrackInactive   = "conntrack_inactive"   // no rule uses conntrack in the node's network namespace
	standbyKindConntrackUnreadable = "conntrack_unreadable" // whether it runs could not be read
)

// StandbyKinds are the reason label values of eztunnel_bypass_standby: ""
// while not standing by.
var StandbyKinds = []string{"", standbyKindConntrackInactive, standbyKindConntrackUnreadable, kindOther}

// IdleKinds are the reason label values of eztunnel_bypass_idle_device and
// eztunnel_bypass_idle_devices.
var IdleKinds = []string{idleKindNoEndpoint, idleKindUplinkDown, idleKindBandwidth,
	podnet.ControlQdisc, podnet.ControlFilter, podnet.ControlTCX, podnet.ControlUnreadable, kindOther}

// kindOther stands for a kind not in its enumeration (none is made: the
// collector never exports free text).
const kindOther = "other"

// enumerated is kind when it is one of kinds, else kindOther.
func enumerated(kind string, kinds []string) string {
	if slices.Contains(kinds, kind) {
		return kind
	}
	return kindOther
}

// collector exports the bridge bypass's counters: the fallback_*
// counters as the reason label of eztunnel_bypass_fallbacks_total.
type collector struct {
	src       source
	counters  map[string]*prometheus.Desc
	fallbacks *prometheus.Desc
	devices   *prometheus.Desc
	endpoints *prometheus.Desc
	up        *prometheus.Desc
	managed   *prometheus.Desc
	standby   *prometheus.Desc
	idle      *prometheus.Desc
	idleKinds *prometheus.Desc
}

var bypassMetric = map[string]struct{ name, help string }{
	"bypassed_packets":           {"packets", "Packets the bridge bypass redirected into their destination pod."},
	"bypassed_bytes":             {"bytes", "Bytes (frames) the bridge bypass redirected into their destination pod."},
	"bypassed_routed_packets":    {"routed_packets", "Bypassed packets sent to the bridge's MAC (routed), rewritten as the node's routing would."},
	"bypassed_cached_packets":    {"cached_packets", "Packets bypassed into a local pod on the checks a recent packet of their flow passed on the same CPU (--bypass-recheck)."},
	"bypassed_out_packets":       {"out_packets", "Packets the bridge bypass sent from a pod to another node (uplink or VXLAN device) without the node's stack."},
	"bypassed_out_bytes":         {"out_bytes", "Bytes (frames) the bridge bypass sent from a pod to another node."},
	"bypassed_out_neigh_packets": {"out_neigh_packets", "Of the packets to another node, those sent with bpf_redirect_neigh (next hop without neighbour entry)."},
	"bypassed_in_packets":        {"in_packets", "Packets the bridge bypass delivered from another node (uplink or VXLAN device) into a local pod."},
	"bypassed_in_bytes":          {"in_bytes", "Bytes (frames) the bridge bypass delivered from another node into a local pod."},
	"conntrack_refreshes":        {"conntrack_refreshes", "Conntrack entries of bypassed flows whose timeout the bypass refreshed."},
	"admissions":                 {"admissions", "Flow directions the kernel path delivered and the bypass recorded as admitted."},
}

// Collectors export the metrics of the bypass the node runs.
func (b *Node) Collectors() []prometheus.Collector { return []prometheus.Collector{newCollector(b)} }

// newCollector describes the bypass metrics.
func newCollector(src source) *collector {
	c := &collector{
		src:      src,
		counters: map[string]*prometheus.Desc{},
		fallbacks: prometheus.NewDesc(namespace+"_bypass_fallbacks_total",
			"Packets the bridge bypass left on the kernel path, by reason.", []string{"reason"}, nil),
		devices: prometheus.NewDesc(namespace+"_bypass_devices",
			"Pod veths and uplinks the bridge bypass is attached to.", nil, nil),
		endpoints: prometheus.NewDesc(namespace+"_bypass_endpoints",
			"Pod addresses the bridge bypass delivers to.", nil, nil),
		managed: prometheus.NewDesc(namespace+"_bypass_managed_neighbours",
			"Kernel-managed neighbour entries the agent keeps on the pod bridges for the node's pods (Kubernetes mode; absent otherwise).", nil, nil),
		standby: prometheus.NewDesc(namespace+"_bypass_standby",
			"1 while the loaded bridge bypass is attached nowhere because it could not act here (reason: conntrack_inactive, conntrack does not run in the node's network namespace, so every packet would fall back; conntrack_unreadable); 0 with reason \"\" otherwise.", []string{"reason"}, nil),
		idle: prometheus.NewDesc(namespace+"_bypass_idle_device",
			"1 for each pod veth or uplink the bridge bypass does not attach to because it could not act there or must not, with the reason as in eztunnel_bypass_idle_devices.", []string{"device", "reason"}, nil),
		idleKinds: prometheus.NewDesc(namespace+"_bypass_idle_devices", idleDevicesHelp, []string{"reason"}, nil),
		up: prometheus.NewDesc(namespace+"_bypass_up",
			"1 if this scrape read the bridge bypass's counters, 0 if not (the agent logs why).", nil, nil),
	}
	for _, name := range CounterNames() {
		if strings.HasPrefix(name, fallbackPrefix) {
			continue
		}
		m, ok := bypassMetric[name]
		if !ok {
			m.name, m.help = name, "Bridge bypass counter "+name+"."
		}
		c.counters[name] = prometheus.NewDesc(namespace+"_bypass_"+m.name+"_total", m.help, nil, nil)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{c.fallbacks, c.devices, c.endpoints, c.up, c.managed, c.standby, c.idle, c.idleKinds} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	devices, endpoints := c.src.BypassState()
	if kind := c.src.BypassStandbyKind(); kind != "" {
		ch <- prometheus.MustNewConstMetric(c.standby, prometheus.GaugeValue, 1, enumerated(kind, StandbyKinds))
	} else {
		ch <- prometheus.MustNewConstMetric(c.standby, prometheus.GaugeValue, 0, "")
	}
	byKind := map[string]int{}
	for _, kind := range IdleKinds {
		byKind[kind] = 0 // every reason, so that the family is always there
	}
	for dev, kind := range c.src.BypassIdleKinds() {
		kind = enumerated(kind, IdleKinds)
		ch <- prometheus.MustNewConstMetric(c.idle, prometheus.GaugeValue, 1, dev, kind)
		byKind[kind]++
	}
	for kind, n := range byKind {
		ch <- prometheus.MustNewConstMetric(c.idleKinds, prometheus.GaugeValue, float64(n), kind)
	}
	ch <- prometheus.MustNewConstMetric(c.devices, prometheus.GaugeValue, float64(devices))
	ch <- prometheus.MustNewConstMetric(c.endpoints, prometheus.GaugeValue, float64(endpoints))
	if m, ok := c.src.(managedNeighbourSource); ok {
		if n, ok := m.BypassManagedNeighbours(); ok {
			ch <- prometheus.MustNewConstMetric(c.managed, prometheus.GaugeValue, float64(n))
		}
	}
	up := 1.0
	if counters, err := c.src.BypassCounters(); err != nil {
		up = 0
		slog.Warn("metrics: reading bypass counters", "err", err)
	} else {
		for name, v := range counters {
			if reason, ok := strings.CutPrefix(name, fallbackPrefix); ok {
				ch <- prometheus.MustNewConstMetric(c.fallbacks, prometheus.CounterValue, float64(v), reason)
			} else if d, ok := c.counters[name]; ok {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}

// Enabled is eztunnel_bypass_enabled: 1 (reason "") while the agent runs
// the bridge bypass; 0 with the kind of reason it does not (off: one of
// parts.Codes, e.g. disabled_by_flag or node_unsuitable; "" while it runs).
func Enabled(off parts.Code) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "bypass_enabled",
		Help: "1 if the agent runs the bridge bypass; 0 if not, with the reason's code (as eztunnel_feature_enabled's).",
	}, []string{"reason"})
	st := parts.Status{Part: parts.Bypass, Runs: off == "", Code: off}
	if st.Runs {
		g.WithLabelValues("").Set(1)
	} else {
		g.WithLabelValues(st.Label()).Set(0)
	}
	return g
}
