/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sk_msg: runs for every sendmsg/sendfile/splice of an enrolled socket. A
 * paired socket redirects into its peer's receive queue; a client whose server
 * is not paired yet sends on the kernel path and waits for it
 * (early_data_waits), or, in gauge mode, settles once for the kernel path
 * (settle_client), and the server's ESTABLISHED removes it from the sockhash
 * before anything can arrive through the stack (the FIONREAD bug:
 * tcp_bpf_ioctl reports only psock bytes).
 */
#ifndef EZ_SHORTCUT_SKMSG_H
#define EZ_SHORTCUT_SKMSG_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "shortcut/maps.h"
#include "shortcut/sockops.h"
#include "shortcut/unread.h"
#include "shortcut/adopt.h"
#include "shortcut/splice.h"


/*
 * The peer is gone (closed or reset): this message takes the kernel path,
 * which gives the RST/EPIPE plain TCP gives, for good: this end then leaves
 * the sockhash too (may_leave), and an adopted end's stack send is not taken
 * for a send that raced its insert (adopt_switch_late).
 */
static __always_inline int peer_gone(struct ez_unread *u, __u32 dir, __u32 size)
{
	__sync_fetch_and_add(&u->unread[dir], -(__s64)size);
	__sync_val_compare_and_swap(&u->switched, 0, 1);
	count(EZ_C_FB_PEER_GONE);
	return SK_PASS;
}

/*
 * A client writes before its server end is established (client-first
 * protocols write right after connect; the server's ESTABLISHED comes when
 * its softirq handles the handshake's last ACK, or the first data segment if
 * that ACK was lost). Its bytes take the kernel path and the client stays
 * WAITING: the server still pairs, and the client's direction opens as any
 * other, once the server has read every kernel-path byte (tx_open's sequence
 * proof). Not in gauge mode, where no read is seen and tx_open trusts every
 * receiver: there the client settles for the kernel path (early data).
 */
static __always_inline bool early_data_waits(const struct ez_sock *es)
{
	struct ez_pair *p;

	if (rx_gauge())
		return false;
	p = bpf_map_lookup_elem(&ez_sc_pairs, &es->key);
	return p && p->client_cookie == es->self_cookie && p->state == EZ_PAIR_CLIENT;
}

/*
 * Node TCP memory pressure (tcp_memory_pressure: TCP holds more than
 * tcp_mem[1]). bpf_tcp_ingress charges redirected bytes to the receiver
 * with __sk_rmem_schedule, which under pressure fails past the socket's
 * fair share, and at tcp_mem[2] always: the sender's sendmsg then returns
 * ENOMEM, which plain TCP never does (its sender waits for memory:
 * sk_stream_wait_memory). So under pressure the direction goes back to the
 * kernel path, whose window and memory waits hold the writer. Bytes already
 * redirected are in the receiver's psock, which tcp_bpf_recvmsg reads
 * before sk_receive_queue: nothing is overtaken. Out of gauge mode the
 * direction opens again by tx_open's sequence proof (the receiver read every
 * kernel-path byte), and the pressure is checked again at each message.
 * In gauge mode (no proof) the connection switches for good, as
 * backpressure does. Not seen: a memory cgroup's socket pressure (cgroup v2
 * charges socket memory to the receiver's memcg), nor the window between
 * this check and the charge.
 */
static __always_inline bool tx_mem_pressure(struct bpf_sock *bsk, struct ez_sock *es, struct ez_unread *u)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(bsk);
	unsigned long *mp, v = 0;

	if (!tp)
		return false;
	mp = BPF_CORE_READ((struct sock *)tp, __sk_common.skc_prot, memory_pressure);
	if (!mp || bpf_probe_read_kernel(&v, sizeof(v), mp) || !v)
		return false;
	if (rx_gauge()) {
		if (__sync_val_compare_and_swap(&u->switched, 0, 1) == 0)
			count(EZ_C_FB_BACKPRESSURE);
		return true;
	}
	if (__sync_fetch_and_and(&es->flags, ~EZ_F_TX_OPEN) & EZ_F_TX_OPEN)
		count(EZ_C_RX_REGATED);
	__sync_fetch_and_or(&es->flags, EZ_F_TX_REGATED);
	return true;
}

SEC("sk_msg")
int ez_sc_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	__u32 size = msg->size;
	struct ez_unread *u;
	struct ez_sock *es;
	__u32 state, dir;
	__u64 key;
	__s64 total, bound;

	if (!sk)
		return SK_PASS;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (!es)
		return SK_PASS;
	state = es->state;
	/* sendmsg holds the socket lock, as does the STATE_CB settle. */
	if (state == EZ_SOCK_WAITING) {
		if (early_data_waits(es)) {
			count(EZ_C_RX_GATED);
			return SK_PASS;
		}
		state = settle_client(es);
	}
	/* Adopted while this end was not activated yet: settle, or abort and
	 * take the kernel path (its tripwire then unlinks both ends before
	 * the segment leaves). */
	if (state == EZ_SOCK_ADOPT_IN) {
		struct ez_adopt *a = adopt_record(es);

		if (a && !adopt_abort(a, EZ_A_SKIP_BUSY))
			state = adopt_settle(es);
		if (state != EZ_SOCK_PAIRED)
			return SK_PASS;
	}
	if (state != EZ_SOCK_PAIRED)
		return SK_PASS;
	/* Uninstall: from this message on, this direction takes the kernel path.
	 * Everything redirected before is already in the peer's psock queue,
	 * which tcp_bpf_recvmsg reads before the TCP receive queue: no reorder.
	 * The flag never goes back, and sendmsg is serialised by the socket
	 * lock, so no later message of this socket is redirected. */
	if (draining())
		return SK_PASS;
	/* After shutdown(SHUT_WR), or once reset, the kernel path gives the
	 * application the EPIPE/ECONNRESET plain TCP gives: nothing is sent. */
	if (sk->state != BPF_TCP_ESTABLISHED && sk->state != BPF_TCP_CLOSE_WAIT)
		return SK_PASS;
	key = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &key);
	if (!u || u->switched)
		return SK_PASS;
	/* A receiver that has not read with recvmsg, or not every byte the
	 * kernel path brought it, or splices (shortcut/splice.h). */
	if (!tx_open(es, sk, u))
		return SK_PASS;
	if (tx_mem_pressure(sk, es, u))
		return SK_PASS;
	/* An adopted end with stack bytes not acknowledged: a send that raced
	 * the insert queued them and they may not have left yet (the tripwire
	 * sees them only when they do). Redirecting now could overtake them.
	 * A direction opened by tx_open's sequence proof needs no such check:
	 * its receiver read every stack byte this end wrote. */
	if ((es->flags & EZ_F_ADOPTED) && !(es->flags & EZ_F_TX_OPEN)) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);

		if (tp && tp->write_seq != tp->snd_una) {
			adopt_switch_late(u);
			return SK_PASS;
		}
	}
	/* Backpressure (shortcut/unread.h): add, then check `switched`. The
	 * receiver leaves the sockhash only after it read switched == 1 and then
	 * unread <= 0, so either we see switched here or our bytes are counted
	 * before it looks: it never leaves under a redirect of ours. A message
	 * that would pass the bound switches the connection for good and takes
	 * the kernel path itself; at most the bound stays unread. */
	dir = tx_dir(es) & 1;
	total = __sync_fetch_and_add(&u->unread[dir], size) + size;
	/* Gauge mode (unread.h, ez_sc_rx_socks): unread[dir] only grows; the
	 * bound is checked against what the receiver holds now. */
	if (rx_gauge()) {
		__s64 q = rx_queued(es->peer_cookie);

		if (q < 0) {
			/* The receiver left ez_sc_rx_socks at TCP_CLOSE (or was
			 * never found): a gone peer, as a failed redirect. */
			count(EZ_C_GAUGE_UNKNOWN);
			return peer_gone(u, dir, size);
		}
		total = q + size;
	}
	bound = u->bound[dir];
	if (ez_cfg_flags & EZ_CFG_KERNEL_BP)
		bound += EZ_KERNEL_BP_SLACK;
	if (u->switched || total > bound) {
		__sync_fetch_and_add(&u->unread[dir], -(__s64)size);
		if (__sync_val_compare_and_swap(&u->switched, 0, 1) == 0)
			count(EZ_C_FB_BACKPRESSURE);
		return SK_PASS;
	}
	/* The peer leaves the sockhash only when it is closed or reset (or
	 * switched, which we checked): there is no reader left to see an order,
	 * so the kernel path is the honest answer (it produces the RST/EPIPE
	 * plain TCP would). */
	if (bpf_msg_redirect_hash(msg, &ez_sc_sockets, &es->peer_cookie, BPF_F_INGRESS) != SK_PASS)
		return peer_gone(u, dir, size);
	es->tx_msgs++;
	es->tx_bytes += size;
	count(EZ_C_MSGS_REDIRECTED);
	count_add(EZ_C_BYTES_REDIRECTED, size);
	return SK_PASS;
}

#endif
