// Package metrics exports the datapath's counters and map fill levels in the
// Prometheus format. Nothing is counted here: every scrape reads the BPF maps.
package metrics

import (
	"log/slog"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

const namespace = "eztunnel"

// fallbackPrefix marks the datapath counters exported as one vector,
// eztunnel_fallbacks_total{reason=...}.
const fallbackPrefix = "fallback_"

// messageFallbacks are the fallback reasons the datapath counts per message,
// not per connection: eztunnel_fallback_messages_total, so that a sum() of
// eztunnel_fallbacks_total counts connections only.
var messageFallbacks = map[string]bool{"peer_gone": true}

// adoptSkipPrefix names the adoption skip counters, exported as one vector.
const adoptSkipPrefix = "adopt_skipped_"

// Source reads the datapath. *datapath.Pinned is one.
type Source interface {
	ReadCounters() (datapath.Counters, error)
	ReadFill() (map[string]datapath.MapFill, error)
}

// Collector is a prometheus.Collector reading a Source on every scrape.
type Collector struct {
	src       Source
	version   string
	counters  map[string]*prometheus.Desc // datapath counter name -> its own metric
	fallback  *prometheus.Desc
	fbMsgs    *prometheus.Desc
	adoptSkip *prometheus.Desc
	entries   *prometheus.Desc
	maxEnt    *prometheus.Desc
	info      *prometheus.Desc
	up        *prometheus.Desc
}

// NewCollector describes one metric per datapath counter (the fallback_*
// counters as the reason label of eztunnel_fallbacks_total, or of
// eztunnel_fallback_messages_total for messageFallbacks).
func NewCollector(src Source, version string) *Collector {
	c := &Collector{
		src:      src,
		version:  version,
		counters: map[string]*prometheus.Desc{},
		adoptSkip: prometheus.NewDesc(namespace+"_adopt_skipped_total",
			"Connections established before the agent that an adoption round left on the kernel path, by reason (counted per round).", []string{"reason"}, nil),
		fallback: prometheus.NewDesc(namespace+"_fallbacks_total",
			"Connections left on (or moved to) the kernel path, by reason.", []string{"reason"}, nil),
		fbMsgs: prometheus.NewDesc(namespace+"_fallback_messages_total",
			"Messages left on the kernel path, by reason (peer_gone: the redirect target had closed).", []string{"reason"}, nil),
		entries: prometheus.NewDesc(namespace+"_map_entries",
			"Entries in a datapath map.", []string{"map"}, nil),
		maxEnt: prometheus.NewDesc(namespace+"_map_max_entries",
			"Capacity of a datapath map.", []string{"map"}, nil),
		info: prometheus.NewDesc(namespace+"_agent_info",
			"Version of the agent and schema of the pinned datapath; always 1.", []string{"version", "schema"}, nil),
		up: prometheus.NewDesc(namespace+"_datapath_up",
			"1 if this scrape read every datapath map, 0 if a read failed (the agent logs why).", nil, nil),
	}
	for _, name := range datapath.CounterNames() {
		if strings.HasPrefix(name, fallbackPrefix) || strings.HasPrefix(name, adoptSkipPrefix) {
			continue
		}
		c.counters[name] = prometheus.NewDesc(namespace+"_"+name+"_total", counterHelp(name), nil, nil)
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	for _, d := range []*prometheus.Desc{c.fallback, c.fbMsgs, c.adoptSkip, c.entries, c.maxEnt, c.info, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1, c.version, datapath.Schema)
	up := 1.0
	if counters, err := c.src.ReadCounters(); err != nil {
		up = 0
		slog.Warn("metrics: reading datapath counters", "err", err)
	} else {
		for name, v := range counters {
			if reason, ok := strings.CutPrefix(name, fallbackPrefix); ok {
				d := c.fallback
				if messageFallbacks[reason] {
					d = c.fbMsgs
				}
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), reason)
			} else if reason, ok := strings.CutPrefix(name, adoptSkipPrefix); ok {
				ch <- prometheus.MustNewConstMetric(c.adoptSkip, prometheus.CounterValue, float64(v), reason)
			} else if d, ok := c.counters[name]; ok {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
			}
		}
	}
	if fill, err := c.src.ReadFill(); err != nil {
		up = 0
		slog.Warn("metrics: reading datapath map fill", "err", err)
	} else {
		for name, f := range fill {
			ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(f.Entries), name)
			ch <- prometheus.MustNewConstMetric(c.maxEnt, prometheus.GaugeValue, float64(f.MaxEntries), name)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}

var help = map[string]string{
	"sockets_enrolled":              "Sockets inserted into the sockhash.",
	"pairs":                         "Connections with both directions redirected.",
	"messages_redirected":           "Messages redirected from one socket to its peer.",
	"bytes_redirected":              "Bytes redirected from one socket to its peer.",
	"handshakes":                    "SYNs registered by listeners in scope and proven by their SYN-ACK.",
	"nat_aliases":                   "Handshakes NAT-ed in the server's namespace, learnt from the SYN-ACK.",
	"sockets_released":              "Enrolled sockets handed back to the kernel path.",
	"record_delete_failed":          "Pairing or unread records the datapath could not delete (left in their map).",
	"gauge_unknown":                 "Gauge mode (no read counter: neither fexit on tcp_bpf_recvmsg nor sock_recv_length): sends whose receiver socket was not found (closed), so the connection switched to the kernel path (also counted as fallback peer_gone).",
	"rx_gated":                      "Messages sent on the kernel path because their receiver had not read with recvmsg yet, or not every byte the kernel path brought it (a splice could not see redirected bytes).",
	"rx_opened":                     "Directions that moved from the kernel path to the shortcut once their receiver had read every kernel-path byte with recvmsg.",
	"rx_regated":                    "Directions that went back from the shortcut to the kernel path under node TCP memory pressure (a redirect would have failed the sender's write with ENOMEM); each opens again once its receiver has read every kernel-path byte (rx_opened).",
	"splice_stranded":               "Splices (or sendfiles) from a socket that held redirected bytes unread: only recvmsg reads them.",
	"adopt_rounds":                  "Rounds looking for connections established before the agent to adopt.",
	"adopted":                       "Connections established before the agent and adopted onto the shortcut.",
	"adopt_late_stack":              "Adopted connections switched to the kernel path because a send that raced the insert took the stack (rare).",
	"close_resets_armed":            "FINs of sockets closed with redirected bytes unread, to be sent as RST as plain TCP does.",
	"close_resets_sent":             "Armed FINs rewritten to RST on the loopback device or a pod veth.",
	"close_resets_expired":          "Armed FINs found too old to rewrite.",
	"close_reset_uncovered_sockets": "Sockets enrolled while the loopback of their network namespace did not carry the RST-on-close program yet (the agent attaches it at the namespace's first handshake): closed with unread bytes over that loopback, such a socket sends FIN, not RST.",
}

func counterHelp(name string) string {
	if h, ok := help[name]; ok {
		return h
	}
	return "Datapath counter " + name + "."
}
