/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * RST on close with unread data. Plain TCP's __tcp_close finds unread bytes
 * in sk_receive_queue and sends RST (the peer reads ECONNRESET). Under the
 * shortcut sock_map_close drops the psock first, its queue is never scanned,
 * and tcp_close sends FIN. No BPF hook can make tcp_close reset (SO_LINGER is
 * not settable from BPF) and cgroup_skb cannot rewrite packets, so:
 *  1. cgroup/sock_release runs in inet_release before sk_prot->close: a
 *     paired socket whose receive direction has redirected bytes unread
 *     (ez_unread; with the gauge, its psock queue) gets EZ_F_CLOSE_RESET.
 *     Only close() runs it: shutdown() keeps its FIN, as in plain TCP.
 *  2. cgroup_skb egress sees that socket's FIN after NAT (ip_finish_output)
 *     and arms ez_sc_resets with its wire tuple and sequence number.
 *  3. tc programs on the devices of the agent's namespace the FIN crosses
 *     (lo egress, pod veths both ways; attached first: tcx, or a legacy
 *     cls_bpf filter at priority 1 before Linux 6.6) rewrite the armed FIN
 *     into RST|ACK. Its sequence number is the FIN's, snd_nxt, which is what
 *     tcp_send_active_reset uses, so the peer's stack takes it as plain TCP's
 *     reset. The entry goes, and so does the flag: the closer's orphan, still
 *     in FIN_WAIT1, retransmits its FIN after an RTO, and the peer, whose
 *     socket the RST closed, answers it with RST.
 * A FIN that crosses no such device (the loopback of a pod's own namespace)
 * stays a FIN; the entry ages out (EZ_RESET_TTL_NS, LRU).
 * Where the fentry NAT learner is refused, the same tc program also learns
 * the node's NAT at SYN-ACKs (EZ_CFG_NAT_TC, nat.h), so that no NAT hook
 * runs for every packet.
 */
#ifndef EZ_SHORTCUT_CLOSERESET_H
#define EZ_SHORTCUT_CLOSERESET_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lib/addr.h"
#include "lib/counters.h"
#include "lib/parse.h"
#include "shortcut/control.h"
#include "shortcut/unread.h"

/* An armed FIN crosses the devices within microseconds; older entries are stale. */
#define EZ_RESET_TTL_NS (5ULL * 1000 * 1000 * 1000)
#define EZ_RESET_ETH_HLEN 14 /* tc sees the Ethernet header; lo has one too (zero MACs) */

static __always_inline void reset_count(__u32 c)
{
	ez_counter_add(&ez_sc_reset_counters, c, 1);
}

/* The key of a parsed TCP packet with sequence number seq (host order). */
static __always_inline void reset_key(struct ez_reset_key *k, const struct ez_flow *f, __u32 seq)
{
	if (f->family == 4) {
		ip_from_v4(k->saddr, f->saddr[0]);
		ip_from_v4(k->daddr, f->daddr[0]);
	} else {
		ip_from_v6(k->saddr, f->saddr);
		ip_from_v6(k->daddr, f->daddr);
	}
	k->sport = f->sport;
	k->dport = f->dport;
	k->seq = seq;
}

static __always_inline bool plain_fin_flags(__u8 flags)
{
	return (flags & (EZ_TCP_FIN | EZ_TCP_SYN | EZ_TCP_RST)) == EZ_TCP_FIN;
}

/* A TCP segment with FIN and neither SYN nor RST, not a fragment. */
static __always_inline bool is_plain_fin(const struct ez_flow *f)
{
	if (f->proto != EZ_IPPROTO_TCP || (f->flags & (EZ_FLOW_FRAG | EZ_FLOW_TCP)) != EZ_FLOW_TCP)
		return false;
	return plain_fin_flags(f->tcp_flags);
}

/* cgroup_skb egress, for every packet that is not a handshake's (egress.h). */
static __always_inline void arm_close_reset(struct __sk_buff *skb, const struct ez_pkt *p, const struct ez_flow *f)
{
	struct ez_reset_key k = {};
	struct bpf_sock *sk = skb->sk;
	struct ez_sock *es;
	__u32 seq;
	__u64 now;

	if (!sk || !is_plain_fin(f))
		return;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (!es || !(es->flags & EZ_F_CLOSE_RESET))
		return;
	if (ez_pkt_read(p, false, f->l4off + 4, &seq, sizeof(seq)))
		return;
	reset_key(&k, f, bpf_ntohl(seq));
	now = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&ez_sc_resets, &k, &now, BPF_ANY))
		return;
	es->flags &= ~EZ_F_CLOSE_RESET; /* a retransmitted FIN stays a FIN */
	reset_count(EZ_R_ARMED);
}

/* TCP header bytes 12-13: data offset and flags. */
#define EZ_TCP_OFF_FLAGS 12
#define EZ_TCP_OFF_CSUM 16
#define EZ_TCP_PSH 0x08

#endif
