// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Packet-path tracer: tracepoints, tcx observers and netfilter links only. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "lib/counters.h"
#include "tracer/tracer.h"

/* Maps, filters and counters. Sizes are defaults; Go resizes before load.
 * The headers below use them. */

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

/* The sk_buff netif_receive_skb saw last on this CPU: sk_data_ready,
 * which carries only the socket, follows it synchronously in the softirq
 * (sock.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} trc_last_rx SEC(".maps");

/* The traced sk_buff tcp_rcv_established (tcp_probe) started on last, by
 * socket address: sk_data_ready names it before trc_last_rx. Keyed by the
 * socket, not per CPU: release_sock runs a socket's backlog with bottom
 * halves on and may reschedule (__release_sock), so another packet's
 * receive can run between the two on the same CPU, and the task can move. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} trc_probe_skb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_TRC_COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} trc_counters SEC(".maps");

/* Configuration (struct ez_trc_config), set on the spec before load. */
volatile const struct ez_trc_config ez_trc_cfg;

static __always_inline void trc_count(__u32 c, __u64 n)
{
	ez_counter_add(&trc_counters, c, n);
}

/* Helpers (headers): they use the maps above. */
#include "tracer/track.h"
#include "tracer/tp.h"
#include "tracer/tcx.h"
#include "tracer/nf.h"
#include "tracer/sock.h"

/* Tracepoints (tracer/tp.h, tracer/sock.h). */
#define TRC_TP(name, body)						\
	SEC("tp_btf/" #name)						\
	int trc_btf_##name(__u64 *ctx) { body(ctx, true); return 0; }	\
	SEC("raw_tp/" #name)						\
	int trc_raw_##name(struct bpf_raw_tracepoint_args *ctx) { body(ctx->args, false); return 0; }

TRC_TP(netif_rx, trc_rx)
TRC_TP(napi_gro_receive_entry, trc_rx)
TRC_TP(netif_receive_skb, trc_recv)
TRC_TP(net_dev_queue, trc_queue)
TRC_TP(net_dev_start_xmit, trc_xmit)
TRC_TP(net_dev_xmit, trc_done)
TRC_TP(skb_copy_datagram_iovec, trc_copy)
TRC_TP(consume_skb, trc_consume)
TRC_TP(kfree_skb, trc_kfree)
TRC_TP(tcp_probe, trc_probe)
TRC_TP(sk_data_ready, trc_ready)
TRC_TP(sock_send_length, trc_send)
TRC_TP(sock_recv_length, trc_recvmsg)

/* tcx observers (tracer/tcx.h). */
SEC("tcx/ingress")
int trc_tcxi_first(struct __sk_buff *ctx) { return trc_tcx(ctx, TRC_K_TCXI_FIRST); }
SEC("tcx/ingress")
int trc_tcxi_last(struct __sk_buff *ctx) { return trc_tcx(ctx, TRC_K_TCXI_LAST); }
SEC("tcx/egress")
int trc_tcxe_first(struct __sk_buff *ctx) { return trc_tcx(ctx, TRC_K_TCXE_FIRST); }
SEC("tcx/egress")
int trc_tcxe_last(struct __sk_buff *ctx) { return trc_tcx(ctx, TRC_K_TCXE_LAST); }

/* Netfilter timing (tracer/nf.h). */
#define TRC_NF(name, table)						\
	SEC("netfilter")						\
	int trc_nf_##name##_before(struct bpf_nf_ctx *ctx) { trc_nf(ctx, table, true); return TRC_NF_ACCEPT; } \
	SEC("netfilter")						\
	int trc_nf_##name##_after(struct bpf_nf_ctx *ctx) { trc_nf(ctx, table, false); return TRC_NF_ACCEPT; }

TRC_NF(raw, EZ_TRC_T_RAW)
TRC_NF(conntrack, EZ_TRC_T_CONNTRACK)
TRC_NF(mangle, EZ_TRC_T_MANGLE)
TRC_NF(dnat, EZ_TRC_T_DNAT)
TRC_NF(filter, EZ_TRC_T_FILTER)
TRC_NF(snat, EZ_TRC_T_SNAT)

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that BTF, and so bpf2go, carries the enums Go reads. */
const enum ez_trc_stage ez_trc_stage_enum __attribute__((unused));
const enum ez_trc_table ez_trc_table_enum __attribute__((unused));
const enum ez_trc_prio ez_trc_prio_enum __attribute__((unused));
const enum ez_trc_nf ez_trc_nf_enum __attribute__((unused));
const enum ez_trc_end ez_trc_end_enum __attribute__((unused));
const enum ez_trc_counter ez_trc_counter_enum __attribute__((unused));
const enum ez_trc_limits ez_trc_limits_enum __attribute__((unused));
