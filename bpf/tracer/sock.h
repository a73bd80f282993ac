/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Socket-level counters: sendmsg/recvmsg of sockets the filter selects.
 * With the socket shortcut, data moves from socket to socket through
 * sk_msg redirect and no sk_buff stage fires; these counters show the bytes
 * that took the saved path (shortcut/skmsg.h itself is not instrumented).
 */
#ifndef EZ_TRACER_SOCK_H
#define EZ_TRACER_SOCK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "lib/parse.h"
#include "tracer/tracer.h"
#include "tracer/filter.h"
#include "tracer/tp.h"

/* TRC_SK reads sk->__sk_common.field directly (btf) or through a helper. */
#define TRC_SK(btf, sk, field) ((btf) ? (sk)->__sk_common.field : BPF_CORE_READ(sk, __sk_common.field))

static __always_inline bool trc_sock_match(struct sock *sk, bool btf)
{
	struct ez_flow fl = {};
	__u16 family = TRC_SK(btf, sk, skc_family);

	if (family == 2 /* AF_INET */) {
		fl.family = 4;
		fl.saddr[0] = TRC_SK(btf, sk, skc_rcv_saddr);
		fl.daddr[0] = TRC_SK(btf, sk, skc_daddr);
	} else if (family == 10 /* AF_INET6 */) {
		fl.family = 6;
		if (btf) {
			for (int i = 0; i < 4; i++) {
				fl.saddr[i] = sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32[i];
				fl.daddr[i] = sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32[i];
			}
		} else {
			BPF_CORE_READ_INTO(&fl.saddr, sk, __sk_common.skc_v6_rcv_saddr);
			BPF_CORE_READ_INTO(&fl.daddr, sk, __sk_common.skc_v6_daddr);
		}
	} else {
		return false;
	}
	fl.proto = btf ? sk->sk_protocol : BPF_CORE_READ(sk, sk_protocol);
	fl.sport = TRC_SK(btf, sk, skc_num);
	fl.dport = bpf_ntohs(TRC_SK(btf, sk, skc_dport));
	if (!ez_trc_cfg.netns)
		return trc_match(&fl, ez_trc_cfg.ifindex, 0);
	return trc_match(&fl, ez_trc_cfg.ifindex, btf ? sk->__sk_common.skc_net.net->net_cookie :
				     BPF_CORE_READ(sk, __sk_common.skc_net.net, net_cookie));
}

static __always_inline void trc_sock(__u64 *a, __u32 calls, bool btf)
{
	int ret = (int)a[1];

	if (ret <= 0 || !trc_sock_match((void *)a[0], btf))
		return;
	trc_count(calls, 1);
	trc_count(calls + 1, ret);
}

static __always_inline void trc_send(__u64 *a, bool btf) { trc_sock(a, EZ_TRC_C_SOCK_SEND, btf); }
static __always_inline void trc_recvmsg(__u64 *a, bool btf) { trc_sock(a, EZ_TRC_C_SOCK_RECV, btf); }

/*
 * sk_data_ready(sk): data was queued to sk (sock_def_readable, for TCP and
 * UDP). It carries no sk_buff: for TCP, the one tcp_probe saw last for this
 * socket (trc_probe_skb: tcp_rcv_established starts there, in the softirq or
 * from the socket's backlog); otherwise the one netif_receive_skb saw last on
 * this CPU (the receive path runs from there to the socket without another
 * netif_receive_skb; bpf_redirect_peer continues the same receive without a
 * new one). It is accepted only when its lifetime is on the receiving side,
 * not queued yet, and its protocol and destination port are the socket's. A
 * lifetime never starts here.
 */
static __always_inline struct ez_trc_pkt *trc_ready_pkt(struct sock *sk, __u64 key, bool btf)
{
	struct ez_trc_pkt *r = bpf_map_lookup_elem(&trc_pkts, &key);

	if (!r || r->last < EZ_TRC_H_RX || r->last >= EZ_TRC_SOCK)
		return NULL;
	if (r->dport != TRC_SK(btf, sk, skc_num) || r->proto != (btf ? sk->sk_protocol : BPF_CORE_READ(sk, sk_protocol)))
		return NULL;
	return r;
}

static __always_inline void trc_ready(__u64 *a, bool btf)
{
	struct sock *sk = (void *)a[0];
	__u64 skk = (__u64)sk, *probed, *last, key = 0;
	struct ez_trc_pkt *r = NULL;
	__u32 zero = 0;
	__u64 now;

	probed = bpf_map_lookup_elem(&trc_probe_skb, &skk);
	if (probed) {
		key = *probed;
		bpf_map_delete_elem(&trc_probe_skb, &skk);
		r = trc_ready_pkt(sk, key, btf);
	}
	if (!r) {
		last = bpf_map_lookup_elem(&trc_last_rx, &zero);
		if (!last || !*last || *last == key)
			return;
		r = trc_ready_pkt(sk, *last, btf);
		if (!r)
			return;
	}
	now = bpf_ktime_get_ns();
	r->ts[EZ_TRC_SOCK] = now;
	r->last = EZ_TRC_SOCK;
	r->last_ns = now;
	r->last_cpu = bpf_get_smp_processor_id();
}

/*
 * tcp_probe(sk, skb): tcp_rcv_established starts on skb, in the softirq or,
 * for a segment that arrived while the application held the socket lock,
 * from release_sock in the application's context, where the last
 * netif_receive_skb of the CPU is another packet. Recording a traced
 * segment by its socket makes the sk_data_ready that follows name it in
 * both cases; an untraced one removes what an earlier segment left, so
 * that sk_data_ready does not name that one.
 */
static __always_inline void trc_probe(__u64 *a, bool btf)
{
	__u64 sk = a[0], skb = a[1];

	if (bpf_map_lookup_elem(&trc_pkts, &skb))
		bpf_map_update_elem(&trc_probe_skb, &sk, &skb, BPF_ANY);
	else if (bpf_map_lookup_elem(&trc_probe_skb, &sk))
		bpf_map_delete_elem(&trc_probe_skb, &sk);
}

#endif
