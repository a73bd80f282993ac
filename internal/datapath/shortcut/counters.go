package shortcut

import (
	"fmt"
	"maps"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Counters are the datapath's per-CPU counters summed over CPUs, by name.
type Counters map[string]uint64

// counterNames are the external (metrics, JSON) names of enum ez_counter.
// TestCounterNamesComplete checks that every enum value has one.
var counterNames = map[shortcutEzCounter]string{
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
}

func counterName(c shortcutEzCounter) string {
	if n, ok := counterNames[c]; ok {
		return n
	}
	return fmt.Sprintf("counter_%d", uint32(c))
}

// CounterNames lists every counter name in enum order, then adoption's.
func CounterNames() []string {
	names := make([]string, 0, shortcutEzCounterEZ_C_MAX)
	for c := shortcutEzCounter(0); c < shortcutEzCounterEZ_C_MAX; c++ {
		names = append(names, counterName(c))
	}
	names = append(names, AdoptCounterNames()...)
	for c := shortcutEzResetCounter(0); c < shortcutEzResetCounterEZ_R_MAX; c++ {
		names = append(names, resetCounterNames[c])
	}
	return names
}

// resetCounterNames are the external names of enum ez_reset_counter
// (bpf/shortcut/closereset.h).
var resetCounterNames = map[shortcutEzResetCounter]string{
	shortcutEzResetCounterEZ_R_ARMED:   "close_resets_armed",
	shortcutEzResetCounterEZ_R_SENT:    "close_resets_sent",
	shortcutEzResetCounterEZ_R_EXPIRED: "close_resets_expired",
}

// readResetCounters adds the close-reset counters of m to c.
func readResetCounters(m *ebpf.Map, c Counters) error {
	for r := shortcutEzResetCounter(0); r < shortcutEzResetCounterEZ_R_MAX; r++ {
		sum, err := bpfsys.SumPerCPU(m, uint32(r))
		if err != nil {
			return fmt.Errorf("read counter %s: %w", resetCounterNames[r], err)
		}
		c[resetCounterNames[r]] = sum
	}
	return nil
}

// ReadCounters sums the per-CPU counters of a counters map.
func ReadCounters(m *ebpf.Map) (Counters, error) {
	out := make(Counters, shortcutEzCounterEZ_C_MAX)
	for c := shortcutEzCounter(0); c < shortcutEzCounterEZ_C_MAX; c++ {
		sum, err := readCounter(m, c)
		if err != nil {
			return nil, err
		}
		out[counterName(c)] = sum
	}
	return out, nil
}

// readCounter sums one per-CPU counter.
func readCounter(m *ebpf.Map, c shortcutEzCounter) (uint64, error) {
	sum, err := bpfsys.SumPerCPU(m, uint32(c))
	if err != nil {
		return 0, fmt.Errorf("read counter %s: %w", counterName(c), err)
	}
	return sum, nil
}

// Counters reads this shortcut's counters.
func (d *Shortcut) Counters() (Counters, error) {
	c, err := ReadCounters(d.objs.EzCounters)
	if err != nil {
		return nil, err
	}
	a, err := ReadAdoptCounters(d.objs.EzAdoptCounters)
	if err != nil {
		return nil, err
	}
	maps.Copy(c, a)
	return c, readResetCounters(d.objs.EzResetCounters, c)
}
