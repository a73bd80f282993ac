package bypass

import (
	"fmt"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Counters are the bypass's per-CPU counters summed over CPUs, by name.
type Counters = bpfsys.Counters

// counters names enum values (external names: metrics, JSON);
// TestCounterNamesComplete checks every value has one.
var counters = bpfsys.CounterSet[bypassEzBpCounter]{Max: bypassEzBpCounterEZ_BP_C_MAX, Names: map[bypassEzBpCounter]string{
	bypassEzBpCounterEZ_BP_C_PACKETS:            "bypassed_packets",
	bypassEzBpCounterEZ_BP_C_BYTES:              "bypassed_bytes",
	bypassEzBpCounterEZ_BP_C_ROUTED:             "bypassed_routed_packets",
	bypassEzBpCounterEZ_BP_C_CT_REFRESHES:       "conntrack_refreshes",
	bypassEzBpCounterEZ_BP_C_ADMISSIONS:         "admissions",
	bypassEzBpCounterEZ_BP_C_FB_NOT_IP:          "fallback_not_ip",
	bypassEzBpCounterEZ_BP_C_FB_NOT_TCP_UDP:     "fallback_not_tcp_udp",
	bypassEzBpCounterEZ_BP_C_FB_FRAGMENT:        "fallback_fragment",
	bypassEzBpCounterEZ_BP_C_FB_IPV6EXT:         "fallback_ipv6_ext_headers",
	bypassEzBpCounterEZ_BP_C_FB_NO_ENDPOINT:     "fallback_no_endpoint",
	bypassEzBpCounterEZ_BP_C_FB_MAC_MISMATCH:    "fallback_mac_mismatch",
	bypassEzBpCounterEZ_BP_C_FB_TTL:             "fallback_ttl",
	bypassEzBpCounterEZ_BP_C_FB_TCP_CONTROL:     "fallback_tcp_control",
	bypassEzBpCounterEZ_BP_C_FB_TOO_BIG:         "fallback_too_big",
	bypassEzBpCounterEZ_BP_C_FB_NO_CONNTRACK:    "fallback_no_conntrack",
	bypassEzBpCounterEZ_BP_C_FB_NOT_ESTABLISHED: "fallback_not_established",
	bypassEzBpCounterEZ_BP_C_FB_NOT_ADMITTED:    "fallback_not_admitted",
	bypassEzBpCounterEZ_BP_C_FB_NAT:             "fallback_nat",
	bypassEzBpCounterEZ_BP_C_FB_HELPER:          "fallback_helper",
	bypassEzBpCounterEZ_BP_C_FB_OTHER:           "fallback_other",
	bypassEzBpCounterEZ_BP_C_OUT_PACKETS:        "bypassed_out_packets",
	bypassEzBpCounterEZ_BP_C_OUT_BYTES:          "bypassed_out_bytes",
	bypassEzBpCounterEZ_BP_C_OUT_NEIGH:          "bypassed_out_neigh_packets",
	bypassEzBpCounterEZ_BP_C_IN_PACKETS:         "bypassed_in_packets",
	bypassEzBpCounterEZ_BP_C_IN_BYTES:           "bypassed_in_bytes",
	bypassEzBpCounterEZ_BP_C_FB_IP_OPTIONS:      "fallback_ip_options",
	bypassEzBpCounterEZ_BP_C_FB_FIB_UNREACHABLE: "fallback_fib_unreachable",
	bypassEzBpCounterEZ_BP_C_FB_FIB_NOT_FWDED:   "fallback_fib_not_forwarded",
	bypassEzBpCounterEZ_BP_C_FB_FIB_OTHER:       "fallback_fib_other",
	bypassEzBpCounterEZ_BP_C_FB_UNKNOWN_DEVICE:  "fallback_unknown_device",
	bypassEzBpCounterEZ_BP_C_FB_ROUTE_MISMATCH:  "fallback_route_mismatch",
	bypassEzBpCounterEZ_BP_C_FB_MARK:            "fallback_mark",
	bypassEzBpCounterEZ_BP_C_FB_SPOOFED:         "fallback_spoofed_source",
	bypassEzBpCounterEZ_BP_C_FB_UDP_OFF:         "fallback_udp_off",
	bypassEzBpCounterEZ_BP_C_FB_IPV6OFF:         "fallback_ipv6_off",
	bypassEzBpCounterEZ_BP_C_FB_PAUSED:          "fallback_paused",
	bypassEzBpCounterEZ_BP_C_CACHED:             "bypassed_cached_packets",
}}

// CounterNames lists every counter name in enum order.
func CounterNames() []string { return counters.List() }

// Counters reads the counters.
func (b *Bypass) Counters() (Counters, error) {
	c, err := counters.Read(b.objs.EzBpCounters)
	if err != nil {
		return nil, fmt.Errorf("bypass: %w", err)
	}
	return c, nil
}
