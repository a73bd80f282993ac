/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps, filters and counters of the packet-path tracer. Sizes are defaults; Go resizes before load. */
#pragma once

/* Live packet lifetimes by sk_buff address. A plain hash, not LRU, so no
 * lifetime disappears silently: a full table is counted (TABLE_FULL) and
 * Go's age sweep removes, emits and counts old entries (EVICTED). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct ez_trc_pkt);
} trc_pkts SEC(".maps");

/* Finished lifetimes. */
#define TRC_RING_BYTES (8 << 20)
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, TRC_RING_BYTES);
} trc_events SEC(".maps");

/* Scratch for building a record: 500 bytes do not fit the 512-byte stack
 * next to everything else. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ez_trc_pkt);
} trc_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_TRC_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} trc_counters SEC(".maps");

/* Configuration, set on the spec before load. Zero means "off". */
volatile const __u64 host_netns;	/* cookie of the tracer's netns: "host" side */
volatile const __u64 max_age_ns;	/* a lifetime idle longer than this ends */
volatile const __u8 f_family;		/* 4 or 6 */
volatile const __u8 f_proto;		/* IPPROTO_TCP, IPPROTO_UDP, ... */
volatile const __u16 f_port;		/* either port, host order */
volatile const __u16 f_sport;
volatile const __u16 f_dport;
volatile const __u8 f_host_set;		/* f_host is either address */
volatile const __u32 f_host[4];		/* IPv4 in f_host[0], network order */
volatile const __u32 f_ifindex;		/* device where the lifetime starts */
volatile const __u64 f_netns;		/* netns cookie where the lifetime starts */

static __always_inline void trc_count(__u32 c, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&trc_counters, &c);

	if (v)
		*v += n;
}
