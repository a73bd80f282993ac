/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup_skb egress: learn NAT from the handshake's first packets. The hook
 * runs in ip_finish_output/ip6_finish_output, after NF_INET_LOCAL_OUT
 * (REDIRECT, DNAT) and NF_INET_POST_ROUTING (SNAT, and the reverse NAT of
 * replies), so it sees packets as they go on the wire:
 *  - a client's SYN: the tuple the server's namespace will receive;
 *  - a listener's SYN-ACK: if it differs from the tuple the listener
 *    registered for the handshake, NAT in the server's namespace rewrote the
 *    SYN, and the client knows the connection by the wire tuple.
 * Every other packet returns after reading its TCP flags (one byte of the
 * linear data), except the FIN of a socket closed with unread data
 * (closereset.h).
 */
#ifndef EZ_SHORTCUT_EGRESS_H
#define EZ_SHORTCUT_EGRESS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "lib/addr.h"
#include "lib/parse.h"
#include "shortcut/key.h"
#include "shortcut/control.h"
#include "shortcut/pair.h"
#include "shortcut/scope.h"
#include "shortcut/closereset.h"
#include "shortcut/syn.h"

/*
 * SYN-ACK of a managed listener: alias the wire tuple to the listener's
 * record. Quirk: cgroup_skb programs see skb->sk = sk_to_full_sk(), the
 * listener, never the request socket; the record is found through
 * ez_sc_syn_index (client ip:port and listening port, in this namespace).
 */
/*
 * The cookie of the socket's network namespace, what bpf_get_netns_cookie
 * returns elsewhere (sock_net(sk)->net_cookie). cgroup_skb may call that
 * helper only from Linux 6.17 on (sk_filter_func_proto): before, the socket's
 * struct net is read through BTF (bpf_skc_to_tcp_sock and a CO-RE read,
 * CAP_PERFMON; net_cookie is a u64 from 5.12 on). 0: not a TCP socket.
 */
static __always_inline __u64 sk_netns_cookie(struct bpf_sock *sk)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);

	if (!tp)
		return 0;
	return BPF_CORE_READ((struct sock *)tp, __sk_common.skc_net.net, net_cookie);
}

/*
 * The SYN-ACK also proves the listener's record (struct ez_pair): it leaves
 * before any client can claim, carries both initial sequence numbers (seq:
 * the listener's snt_isn; ack: the client's ISN + 1) and comes from the
 * listener itself, whose scope sockops cannot read for a request socket.
 * A listener out of scope keeps no record. REDIRECT and DNAT leave sequence
 * numbers alone; NAT that rewrites them (SYNPROXY, seqadj helpers) makes the
 * client's ISNs differ, and the connection takes the kernel path.
 */
static __always_inline void on_synack(struct __sk_buff *skb, struct ez_syn *pkt, const struct ez_pkt *pp,
				      const struct ez_flow *f)
{
	struct ez_conn_key post, wire = {};
	struct bpf_sock *sk = skb->sk;
	struct ez_cgroup *scope = NULL;
	struct ez_syn_index ix = {};
	struct ez_alias alias = {};
	__u32 client_isn, server_isn;
	struct ez_alias *found;
	struct ez_pair *p;
	__u32 seqack[2];
	long err;

	if (!sk || sk->state != BPF_TCP_LISTEN)
		return;
	if (ez_pkt_read(pp, false, f->l4off + 4, seqack, sizeof(seqack)))
		return;
	server_isn = bpf_ntohl(seqack[0]);
	client_isn = bpf_ntohl(seqack[1]) - 1;
	/* The packet goes server -> client: swap the parsed ends. */
	__builtin_memcpy(wire.client_ip, pkt->key.server_ip, 16);
	__builtin_memcpy(wire.server_ip, pkt->key.client_ip, 16);
	wire.client_port = pkt->key.server_port;
	wire.server_port = pkt->key.client_port;
	ix.netns = sk_netns_cookie(sk);
	if (!ix.netns)
		return;
	__builtin_memcpy(ix.client_ip, wire.client_ip, 16);
	ix.client_port = wire.client_port;
	ix.listener_port = sk->src_port;
	found = bpf_map_lookup_elem(&ez_sc_syn_index, &ix);
	if (!found || !found->created_ns)
		return; /* not a managed handshake, or ambiguous */
	post = found->target;
	p = bpf_map_lookup_elem(&ez_sc_pairs, &post);
	if (!p)
		return;
	if (!p->proven) {
		struct ez_pair_proof proof = { .client_isn = client_isn, .server_isn = server_isn };

		if (p->state != EZ_PAIR_SYN)
			return; /* ambiguous before it was proven */
		if (!scope_selected(sk, &scope)) {
			/* A SYN to a listener out of scope: nothing to pair, no state. */
			bpf_map_delete_elem(&ez_sc_syn_index, &ix);
			delete_record(&ez_sc_pairs, &post);
			return;
		}
		/* Replaces a proof left over from an earlier record of this key. */
		err = bpf_map_update_elem(&ez_sc_proofs, &post, &proof, BPF_ANY);
		if (err) {
			count_insert_error(err);
			return;
		}
		/* The proof is written before proven is set (the atomic is a
		 * full barrier); a client reads both after this packet reached it. */
		__sync_val_compare_and_swap(&p->proven, 0, 1);
		count(EZ_C_HANDSHAKES);
	} else {
		struct ez_pair_proof *pr = bpf_map_lookup_elem(&ez_sc_proofs, &post);

		if (!pr || pr->client_isn != client_isn || pr->server_isn != server_isn)
			return; /* not this record's handshake */
	}
	key_set_netns(&wire, ix.netns);
	if (key_equal(&post, &wire))
		return;
	if (p->state != EZ_PAIR_SYN)
		return; /* already ambiguous, or a retransmit after the claim */
	alias.created_ns = bpf_ktime_get_ns();
	alias.target = post;
	err = bpf_map_update_elem(&ez_sc_aliases, &wire, &alias, BPF_NOEXIST);
	if (err == -EEXIST) {
		struct ez_alias *old = bpf_map_lookup_elem(&ez_sc_aliases, &wire);

		if (old && key_equal(&old->target, &post))
			return; /* retransmitted SYN-ACK */
		pair_make_ambiguous(p);
		count(EZ_C_FB_AMBIGUOUS);
		return;
	}
	if (err) {
		count_insert_error(err);
		return;
	}
	p->alias = wire;
	p->has_alias = 1;
	count(EZ_C_NAT_ALIASES);
}

#endif
