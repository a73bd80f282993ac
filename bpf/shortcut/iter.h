/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Iterator over ez_socks (attached with the map as its target): one struct
 * ez_conn_record per paired socket (or one that left after a switch) not closed yet, for `eztunnel
 * connections`. Read-only; runs only when a reader reads the iterator, never
 * on the data path.
 */
#ifndef EZ_SHORTCUT_ITER_H
#define EZ_SHORTCUT_ITER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "shortcut/maps.h"
#include "shortcut/unread.h"


#define EZ_TCP_CLOSE 7

SEC("iter/bpf_sk_storage_map")
int ez_conns(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct ez_conn_record rec = {};
	struct sock *sk = ctx->sk;
	struct ez_sock *es = ctx->value;
	struct ez_unread *u;
	struct net *net;
	__u64 ukey;

	if (!sk || !es)
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
	u = bpf_map_lookup_elem(&ez_unreads, &ukey);
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
