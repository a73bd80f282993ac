/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The connection index: ez_sc_index holds, for every end in the sockhash,
 * what the listing shows of it (struct ez_conn_index). The iterators
 * (shortcut/iter.h) read more, but a reader in a pod with the chart's
 * capabilities can run neither on a kernel that refuses map-element
 * iterators to processes other than the global PID 1: iter/tcp lists only
 * the namespaces it can enter (setns: CAP_SYS_ADMIN). This map is read with
 * plain lookups. Written once per end (not on the data path), deleted at the
 * end's TCP_CLOSE or when it settles on the kernel path; the agent prunes
 * what an aborted adoption left (an end never paired has no ez_sc_unreads
 * record, so the listing never shows it). A full map loses listing entries
 * only (its fill is a metric), never a connection's acceleration.
 */
#ifndef EZ_SHORTCUT_INDEX_H
#define EZ_SHORTCUT_INDEX_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

/* index_add records the end tp with cookie, its storage es, its peer's
 * cookie and flags beyond es's (EZ_F_ADOPTED before the adopted end settles). */
static __always_inline void index_add(struct tcp_sock *tp, const struct ez_sock *es, __u64 cookie, __u64 peer,
				      __u32 flags)
{
	struct ez_conn_index ix = {};
	struct net *net;

	if (!tp)
		return;
	ix.peer_cookie = peer;
	ix.key = es->key;
	ix.flags = (es->flags | flags) & (EZ_F_CLIENT | EZ_F_SERVER | EZ_F_ADOPTED);
	ix.created_ns = bpf_ktime_get_ns();
	net = BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.__sk_common.skc_net.net);
	if (net) {
		ix.netns_cookie = BPF_CORE_READ(net, net_cookie);
		ix.netns_ino = BPF_CORE_READ(net, ns.inum);
	}
	ix.cgroup_id = BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.sk_cgrp_data.cgroup, kn, id);
	bpf_map_update_elem(&ez_sc_index, &cookie, &ix, BPF_ANY);
}

static __always_inline void index_add_sk(struct bpf_sock *sk, const struct ez_sock *es, __u64 cookie, __u64 peer)
{
	index_add(bpf_skc_to_tcp_sock(sk), es, cookie, peer, 0);
}

static __always_inline void index_del(__u64 cookie)
{
	if (cookie)
		bpf_map_delete_elem(&ez_sc_index, &cookie);
}

#endif
