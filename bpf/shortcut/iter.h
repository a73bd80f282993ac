/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * iter/tcp, opened by `eztunnel connections` in each network namespace (the
 * iterator sees the namespace it was opened in): one struct ez_conn_record
 * per paired socket (or one that left after a switch) not closed yet.
 * Read-only; runs only when a reader reads the iterator, never on the data
 * path. Not iter/bpf_sk_storage_map, which walks every namespace at once:
 * some kernels refuse map-element iterators to processes other than the
 * global PID 1 (EPERM, "processed 0 insns"), while iter/tcp loads everywhere
 * from 5.9 (docs/kernels.md).
 */
#ifndef EZ_SHORTCUT_ITER_H
#define EZ_SHORTCUT_ITER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "shortcut/maps.h"
#include "shortcut/unread.h"


#define EZ_TCP_CLOSE 7

SEC("iter/tcp")
int ez_sc_conns(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct ez_conn_record rec = {};
	struct ez_unread *u;
	struct tcp_sock *tp;
	struct ez_sock *es;
	struct sock *sk;
	struct net *net;
	__u64 ukey;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0; /* request and time-wait sockets carry no storage */
	sk = (struct sock *)tp;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (!es)
		return 0;
	if ((es->state != EZ_SOCK_PAIRED && es->state != EZ_SOCK_LEFT) || sk->__sk_common.skc_state == EZ_TCP_CLOSE)
		return 0;
	rec.cookie = es->self_cookie;
	rec.peer_cookie = es->peer_cookie;
	rec.tx_msgs = es->tx_msgs;
	rec.tx_bytes = es->tx_bytes;
	rec.key = es->key;
	rec.flags = es->flags & (EZ_F_CLIENT | EZ_F_SERVER | EZ_F_ADOPTED);
	rec.state = es->state;
	rec.tcp_state = sk->__sk_common.skc_state;
	ukey = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &ukey);
	if (u) {
		rec.rx_unread = u->unread[rx_dir(es) & 1];
		rec.rx_bound = u->bound[rx_dir(es) & 1];
		rec.switched = u->switched;
	}
	net = BPF_CORE_READ(sk, __sk_common.skc_net.net);
	if (net) {
		rec.netns_cookie = BPF_CORE_READ(net, net_cookie);
		rec.netns_ino = BPF_CORE_READ(net, ns.inum);
	}
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}

/* Referenced so that BTF, and so bpf2go, carries the record and its flags. */
const struct ez_conn_record ez_conn_record_type __attribute__((unused));
const enum ez_sock_flags ez_sock_flags_enum __attribute__((unused));

#endif
