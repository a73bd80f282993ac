/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared by the packet-path tracer and Go (internal/tracer). bpf2go
 * generates the Go side from this file: edit it here only. Fixed-width
 * fields, widest first, no holes.
 */
#ifndef EZ_TRACER_H
#define EZ_TRACER_H

#include "vmlinux.h"

/*
 * Stages in path order. "P_" stages are seen in a namespace other than the
 * tracer's (a pod), "H_" stages in the tracer's own (the host) or one of
 * ez_trc_config.hosts. "H2_" stages are seen in a second host namespace,
 * other than the first one the lifetime saw (the receiving node of a
 * cross-node packet, when several node namespaces are hosts). A packet's
 * lifetime only moves forward through this order (see docs/tracing.md):
 * a stage earlier than the last one recorded starts a new lifetime.
 * Stages from EZ_TRC_ORDERED on are recorded but never order a lifetime.
 */
enum ez_trc_stage {
	EZ_TRC_P_NF_OUT,	/* netfilter LOCAL_OUT, first table */
	EZ_TRC_P_NF_POST,	/* netfilter POST_ROUTING, first table */
	EZ_TRC_P_TCXE_FIRST,	/* tcx egress, first program (runs before net_dev_queue fires) */
	EZ_TRC_P_TCXE_LAST,	/* tcx egress, last program */
	EZ_TRC_P_QUEUE,		/* tp net_dev_queue */
	EZ_TRC_P_XMIT,		/* tp net_dev_start_xmit */
	EZ_TRC_H_RX,		/* tp netif_rx / napi_gro_receive_entry */
	EZ_TRC_H_RECV,		/* tp netif_receive_skb */
	EZ_TRC_H_TCXI_FIRST,
	EZ_TRC_H_TCXI_LAST,
	EZ_TRC_H_NF_PRE,
	EZ_TRC_H_NF_IN,
	EZ_TRC_H_NF_FWD,
	EZ_TRC_H_NF_OUT,
	EZ_TRC_H_NF_POST,
	EZ_TRC_H_TCXE_FIRST,
	EZ_TRC_H_TCXE_LAST,
	EZ_TRC_H_QUEUE,
	EZ_TRC_H_XMIT,
	EZ_TRC_H2_RX,		/* H2_*: the H_* stages, in the second host namespace */
	EZ_TRC_H2_RECV,
	EZ_TRC_H2_TCXI_FIRST,
	EZ_TRC_H2_TCXI_LAST,
	EZ_TRC_H2_NF_PRE,
	EZ_TRC_H2_NF_IN,
	EZ_TRC_H2_NF_FWD,
	EZ_TRC_H2_NF_OUT,
	EZ_TRC_H2_NF_POST,
	EZ_TRC_H2_TCXE_FIRST,
	EZ_TRC_H2_TCXE_LAST,
	EZ_TRC_H2_QUEUE,
	EZ_TRC_H2_XMIT,
	EZ_TRC_P_RX,
	EZ_TRC_P_RECV,
	EZ_TRC_P_TCXI_FIRST,
	EZ_TRC_P_TCXI_LAST,
	EZ_TRC_P_NF_PRE,
	EZ_TRC_P_NF_IN,
	EZ_TRC_P_NF_FWD,
	EZ_TRC_SOCK,		/* tp sk_data_ready: queued to a socket (see sock.h) */
	EZ_TRC_COPY,		/* tp skb_copy_datagram_iovec: the application reads it */
	EZ_TRC_FREE,		/* tp consume_skb / kfree_skb: end of the lifetime */
	EZ_TRC_ORDERED,
	EZ_TRC_P_DONE = EZ_TRC_ORDERED, /* tp net_dev_xmit (returns after the peer's netif_rx) */
	EZ_TRC_H_DONE,
	EZ_TRC_H2_DONE,
	EZ_TRC_STAGES,
};

/* Netfilter table classes, in priority order; a base chain belongs to the
 * class whose priority (enum ez_trc_prio) is nearest to its own. */
enum ez_trc_table {
	EZ_TRC_T_RAW,
	EZ_TRC_T_CONNTRACK,
	EZ_TRC_T_MANGLE,
	EZ_TRC_T_DNAT,
	EZ_TRC_T_FILTER,
	EZ_TRC_T_SNAT,
	EZ_TRC_TABLES,
};

/* The priority of each table class (the iptables tables'; conntrack's is
 * NF_IP_PRI_CONNTRACK). Same order as enum ez_trc_table. */
enum ez_trc_prio {
	EZ_TRC_PRIO_RAW = -300,
	EZ_TRC_PRIO_CONNTRACK = -200,
	EZ_TRC_PRIO_MANGLE = -150,
	EZ_TRC_PRIO_DNAT = -100,
	EZ_TRC_PRIO_FILTER = 0,
	EZ_TRC_PRIO_SNAT = 100,
};

enum ez_trc_nf {
	EZ_TRC_HOOKS = 5,	/* NF_INET_PRE_ROUTING .. NF_INET_POST_ROUTING */
	EZ_TRC_SIDES = 3,	/* pod, host, second host */
	/* nf_ns index: (side * EZ_TRC_HOOKS + hook) * EZ_TRC_TABLES + table; side 0 pod, 1 host, 2 second host. */
	EZ_TRC_NF_SLOTS = EZ_TRC_SIDES * EZ_TRC_HOOKS * EZ_TRC_TABLES,
};

/* Why a record was emitted. */
enum ez_trc_end {
	EZ_TRC_END_FREE,	/* consume_skb / kfree_skb */
	EZ_TRC_END_DROP,	/* kfree_skb with a drop reason */
	EZ_TRC_END_REUSED,	/* the address started a new lifetime */
	EZ_TRC_END_AGED,	/* older than max_age_ns when seen again (kernel) */
	EZ_TRC_END_EVICTED,	/* removed by the agent's age sweep */
	EZ_TRC_END_OPEN,	/* still in the table when the trace stopped */
	EZ_TRC_ENDS,
};

/* One packet lifetime: the value of the per-packet table and the ring-buffer event. */
struct ez_trc_pkt {
	__u64 skb;		/* sk_buff address */
	__u64 netns;		/* netns cookie where the lifetime started */
	__u64 host1;		/* netns cookie of the first host-side stage; 0 = none yet */
	__u64 last_ns;		/* latest time seen: ordered stage or netfilter exit */
	__u64 nf_start;		/* scratch: when the current netfilter table began */
	__u64 ts[EZ_TRC_STAGES]; /* bpf_ktime_get_ns(); 0 = not seen */
	__u32 saddr[4];		/* IPv4 in saddr[0] */
	__u32 daddr[4];
	__u32 nf_ns[EZ_TRC_NF_SLOTS]; /* ns spent inside each hook's table */
	__u32 first_ifindex;
	__u32 last_ifindex;
	__u32 first_cpu;
	__u32 last_cpu;
	__u32 len;		/* skb->len at the start */
	__u16 sport;		/* host order */
	__u16 dport;
	__u8 family;		/* 4 or 6 */
	__u8 proto;		/* IPPROTO_* */
	__u8 last;		/* enum ez_trc_stage, latest ordered */
	__u8 end;		/* enum ez_trc_end */
	__u32 drop_reason;	/* enum skb_drop_reason when end is DROP */
};

enum ez_trc_limits {
	EZ_TRC_MAX_HOSTS = 4,
	EZ_TRC_MAX_WIRES = 2,
};

/*
 * The tracer's configuration: one read-only global (ez_trc_cfg), set by Go
 * on the spec before load. Zero means "off" for every filter field.
 */
struct ez_trc_config {
	__u64 host_netns;	/* cookie of the tracer's netns: "host" side */
	__u64 max_age_ns;	/* a lifetime idle longer than this ends */
	__u64 netns;		/* filter: netns cookie where the lifetime starts */
	__u64 hosts[EZ_TRC_MAX_HOSTS];	/* more "host" namespaces (nodes); 0 = unused */
	__u64 wires[EZ_TRC_MAX_WIRES];	/* namespaces not traced at all (the lab's underlay switch: the wire) */
	__u32 host[4];		/* filter: either address; IPv4 in host[0], network order */
	__u32 ifindex;		/* filter: device where the lifetime starts */
	__u16 port;		/* filter: either port, host order */
	__u16 sport;
	__u16 dport;
	__u8 family;		/* filter: 4 or 6 */
	__u8 proto;		/* filter: IPPROTO_TCP, IPPROTO_UDP, ... */
	__u8 host_set;		/* host is set */
	__u8 _pad[3];
};

/* Per-CPU counters. */
enum ez_trc_counter {
	EZ_TRC_C_STARTED,	/* lifetimes started (after the filter) */
	EZ_TRC_C_EMITTED,	/* records written to the ring buffer */
	EZ_TRC_C_RB_DROPS,	/* records lost: ring buffer full */
	EZ_TRC_C_TABLE_FULL,	/* lifetimes not started: per-packet table full */
	EZ_TRC_C_REUSED,	/* lifetimes ended by address reuse */
	EZ_TRC_C_AGED,		/* lifetimes ended by age, found by the kernel */
	EZ_TRC_C_SOCK_SEND,	/* sendmsg calls of matching sockets */
	EZ_TRC_C_SOCK_SEND_BYTES,
	EZ_TRC_C_SOCK_RECV,	/* recvmsg calls of matching sockets */
	EZ_TRC_C_SOCK_RECV_BYTES,
	EZ_TRC_COUNTERS,
};

#endif
