package shortcut

import (
	"maps"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Counters are the datapath's per-CPU counters summed over CPUs, by name.
type Counters = bpfsys.Counters

// counters names enum ez_counter (external names: metrics, JSON);
// TestCounterNamesComplete checks that every enum value has one.
var counters = bpfsys.CounterSet[shortcutEzCounter]{Max: shortcutEzCounterEZ_C_MAX, Names: map[shortcutEzCounter]string{
	shortcutEzCounterEZ_C_SOCKETS_ENROLLED: "sockets_enrolled",
	shortcutEzCounterEZ_C_PAIRS:            "pairs",
	shortcutEzCounterEZ_C_MSGS_REDIRECTED:  "messages_redirected",
	shortcutEzCounterEZ_C_BYTES_REDIRECTED: "bytes_redirected",
	shortcutEzCounterEZ_C_HANDSHAKES:       "handshakes",
	shortcutEzCounterEZ_C_FB_NO_LOCAL_PEER: "fallback_no_local_peer",
	shortcutEzCounterEZ_C_FB_AMBIGUOUS:     "fallback_ambiguous",
	shortcutEzCounterEZ_C_FB_MAP_FULL:      "fallback_map_full",
	shortcutEzCounterEZ_C_FB_EBUSY:         "fallback_ebusy",
	shortcutEzCounterEZ_C_FB_EXCLUDED:      "fallback_excluded",
	shortcutEzCounterEZ_C_FB_EARLY_DATA:    "fallback_early_data",
	shortcutEzCounterEZ_C_FB_SYN_DATA:      "fallback_syn_data",
	shortcutEzCounterEZ_C_FB_PEER_GONE:     "fallback_peer_gone",
	shortcutEzCounterEZ_C_FB_NO_STORAGE:    "fallback_no_storage",
	shortcutEzCounterEZ_C_FB_OTHER:         "fallback_other",
	shortcutEzCounterEZ_C_SOCKETS_RELEASED: "sockets_released",
	shortcutEzCounterEZ_C_NAT_ALIASES:      "nat_aliases",
	shortcutEzCounterEZ_C_FB_BACKPRESSURE:  "fallback_backpressure",
	shortcutEzCounterEZ_C_DELETE_FAILED:    "record_delete_failed",
	shortcutEzCounterEZ_C_GAUGE_UNKNOWN:    "gauge_unknown",
	shortcutEzCounterEZ_C_FB_HALF_CLOSE:    "fallback_half_close",
	shortcutEzCounterEZ_C_FB_UNPROVEN:      "fallback_unproven",
	shortcutEzCounterEZ_C_RX_GATED:         "rx_gated",
	shortcutEzCounterEZ_C_RX_OPENED:        "rx_opened",
	shortcutEzCounterEZ_C_FB_SPLICE:        "fallback_splice",
	shortcutEzCounterEZ_C_SPLICE_STRANDED:  "splice_stranded",
	shortcutEzCounterEZ_C_FB_EVICTED:       "fallback_evicted",
	shortcutEzCounterEZ_C_RX_REGATED:       "rx_regated",
	shortcutEzCounterEZ_C_FB_UNCOVERED:     "fallback_uncovered",
}}

// CounterNames lists every counter name in enum order, then adoption's and
// close-reset's.
func CounterNames() []string {
	names := counters.List()
	names = append(names, adoptCounters.List()...)
	return append(names, resetCounters.List()...)
}

// resetCounters names enum ez_reset_counter (bpf/shortcut/closereset.h).
var resetCounters = bpfsys.CounterSet[shortcutEzResetCounter]{Max: shortcutEzResetCounterEZ_R_MAX, Names: map[shortcutEzResetCounter]string{
	shortcutEzResetCounterEZ_R_ARMED:     "close_resets_armed",
	shortcutEzResetCounterEZ_R_SENT:      "close_resets_sent",
	shortcutEzResetCounterEZ_R_EXPIRED:   "close_resets_expired",
	shortcutEzResetCounterEZ_R_UNCOVERED: "close_reset_uncovered_sockets",
}}

// readResetCounters adds the close-reset counters of m to c.
func readResetCounters(m *ebpf.Map, c Counters) error { return resetCounters.ReadInto(m, c) }

// ReadCounters sums the per-CPU counters of a counters map.
func ReadCounters(m *ebpf.Map) (Counters, error) { return counters.Read(m) }

// readCounter sums one per-CPU counter.
func readCounter(m *ebpf.Map, c shortcutEzCounter) (uint64, error) { return counters.Get(m, c) }

// Counters reads this shortcut's counters.
func (d *Shortcut) Counters() (Counters, error) {
	c, err := ReadCounters(d.objs.EzScCounters)
	if err != nil {
		return nil, err
	}
	a, err := ReadAdoptCounters(d.objs.EzScAdoptCounters)
	if err != nil {
		return nil, err
	}
	maps.Copy(c, a)
	return c, readResetCounters(d.objs.EzScResetCounters, c)
}
