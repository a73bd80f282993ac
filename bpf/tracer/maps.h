/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps, filters and counters of the packet-path tracer. Sizes are defaults; Go resizes before load. */
#ifndef EZ_TRACER_MAPS_H
#define EZ_TRACER_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/counters.h"
#include "tracer/tracer.h"

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

/* The sk_buff netif_receive_skb (or tcp_probe, for a TCP segment TCP
 * processes later from the socket's backlog) saw last on this CPU:
 * sk_data_ready, which carries only the socket, follows it synchronously
 * (sock.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} trc_last_rx SEC(".maps");

EZ_COUNTER_MAP(trc_counters, EZ_TRC_COUNTERS);

/* Configuration (struct ez_trc_config), set on the spec before load. */
volatile const struct ez_trc_config ez_trc_cfg;

static __always_inline void trc_count(__u32 c, __u64 n)
{
	ez_counter_add(&trc_counters, c, n);
}

#endif
