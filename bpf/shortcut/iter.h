/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The connection listing (`eztunnel connections`, the agent's local API): one
 * struct ez_conn_record per paired socket (or one that left after a switch)
 * not closed yet. Read-only; runs only when a reader reads the iterator,
 * never on the data path. Two iterators fill the same record:
 * iter/bpf_sk_storage_map over ez_sc_socks walks every network namespace at
 * once, so the reader needs no setns (CAP_SYS_ADMIN) and no hostPID; some
 * kernels refuse map-element iterators to processes other than the global
 * PID 1 (EPERM, "processed 0 insns"), and there iter/tcp, which loads
 * everywhere from 5.9, runs in each namespace the reader can enter
 * (docs/kernels.md).
 */
#ifndef EZ_SHORTCUT_ITER_H
#define EZ_SHORTCUT_ITER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "shortcut/control.h"
#include "shortcut/unread.h"

#define EZ_TCP_CLOSE 7

/* conn_record fills rec from a socket and its storage; false: not listed. */
static __always_inline bool conn_record(struct sock *sk, struct ez_sock *es, struct ez_conn_record *rec)
{
	struct ez_unread *u;
	struct net *net;
	__u64 ukey;

	if ((es->state != EZ_SOCK_PAIRED && es->state != EZ_SOCK_LEFT) || sk->__sk_common.skc_state == EZ_TCP_CLOSE)
		return false;
	rec->cookie = es->self_cookie;
	rec->peer_cookie = es->peer_cookie;
	rec->tx_msgs = es->tx_msgs;
	rec->tx_bytes = es->tx_bytes;
	rec->key = es->key;
	rec->flags = es->flags & (EZ_F_CLIENT | EZ_F_SERVER | EZ_F_ADOPTED);
	rec->state = es->state;
	rec->tcp_state = sk->__sk_common.skc_state;
	ukey = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &ukey);
	if (u) {
		rec->rx_unread = u->unread[rx_dir(es) & 1];
		rec->rx_bound = u->bound[rx_dir(es) & 1];
		rec->switched = u->switched;
	}
	net = BPF_CORE_READ(sk, __sk_common.skc_net.net);
	if (net) {
		rec->netns_cookie = BPF_CORE_READ(net, net_cookie);
		rec->netns_ino = BPF_CORE_READ(net, ns.inum);
	}
	/* The socket's cgroup (cgroup v2: the pod's) names its pod. */
	rec->cgroup_id = BPF_CORE_READ(sk, sk_cgrp_data.cgroup, kn, id);
	return true;
}

#endif
