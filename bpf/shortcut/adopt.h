/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Adoption: putting a connection established before the agent on the
 * shortcut, with no byte reordered and no enrolled socket ever holding stack
 * bytes (FIONREAD reads only the psock on 6.18). The hazard is
 * tcp_bpf_recvmsg's order: it reads the psock queue before the TCP receive
 * queue, so a redirected message must never land in a receiver whose stack
 * path (in flight, backlog, out-of-order or receive queue) holds older bytes.
 *
 * The two ends cannot be locked together (an iterator holds one socket's
 * lock at a time). So each end proves its own half under its own lock, and a
 * tripwire covers the time in between:
 *
 *   agent: match ends (4-tuple, conntrack, sequence numbers)  -> CANDIDATE
 *   ez_sc_adopt_step, each end under lock_sock: quiet (everything it sent is
 *     acknowledged, everything it received is read), tripwire on   -> CONFIRMED
 *   ez_sc_adopt_step, each end: quiet again, no sleeper, into ez_sc_sockets
 *                                                       -> ONE_IN -> PAIRED
 *   tripwire: a data or FIN segment of a confirmed end, in sockops'
 *     HDR_OPT_LEN_CB (before the segment leaves) -> ABORTED, and both ends
 *     leave ez_sc_sockets before the segment can reach its peer.
 *   sk_msg of an inserted end while not PAIRED -> ABORTED, kernel path.
 *
 * At PAIRED (the second insert): nothing the first end sent since its confirm
 * took the stack (it would have tripped), and it was acknowledged before, so
 * the second end's queues, empty now under its lock, hold everything; the
 * first end's queues were empty at its insert and nothing the second sent
 * since its confirm took the stack. Both stack paths are empty in both
 * directions, and every later send is redirected (sk_prot was swapped at
 * insert). docs/families/shortcut-design.md ("Adoption") has the argument
 * and residuals.
 */
#ifndef EZ_SHORTCUT_ADOPT_H
#define EZ_SHORTCUT_ADOPT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "lib/addr.h"
#include "shortcut/key.h"
#include "shortcut/control.h"
#include "shortcut/scope.h"
#include "shortcut/select.h"
#include "shortcut/unread.h"
#include "shortcut/index.h"
#include "shortcut/coverage.h"

#define EZ_ADOPT_TCP_ESTABLISHED 1
#define EZ_ADOPT_TCP_LISTEN 10
#define EZ_SOL_TCP 6
#define EZ_TCP_BPF_SOCK_OPS_CB_FLAGS 1008
/* Ancestors looked at for an ez_sc_sockops attachment (ez_sc_adopt_hooks). */
#define EZ_ADOPT_HOOK_DEPTH 16
/* Wait-queue entries looked at; more counts as a sleeper. */
#define EZ_ADOPT_WQ_SCAN 8

/* Callbacks an enrolled socket asks for (sockops.h uses the same set). */
#define EZ_ADOPT_CB_FLAGS (BPF_SOCK_OPS_STATE_CB_FLAG | BPF_SOCK_OPS_PARSE_ALL_HDR_OPT_CB_FLAG | \
			   BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG)

static __always_inline bool adopting(const struct ez_sock *es)
{
	return es && (es->state == EZ_SOCK_ADOPT_ARMED || es->state == EZ_SOCK_ADOPT_IN);
}

/* The record of an adopting end (keyed by the client's cookie, as ez_sc_unreads). */
static __always_inline struct ez_adopt *adopt_record(const struct ez_sock *es)
{
	__u64 key = unread_key(es);

	return bpf_map_lookup_elem(&ez_sc_adopts, &key);
}

/* Moves a record that is not PAIRED to ABORTED; false if it is PAIRED. */
static __always_inline bool adopt_abort(struct ez_adopt *a, __u32 reason)
{
	for (int i = 0; i < 4; i++) {
		__u32 s = a->state;

		if (s == EZ_ADOPT_PAIRED)
			return false;
		if (s == EZ_ADOPT_ABORTED)
			return true;
		if (__sync_val_compare_and_swap(&a->state, s, EZ_ADOPT_ABORTED) == s) {
			a->reason = reason;
			adopt_count(reason);
			return true;
		}
	}
	return a->state != EZ_ADOPT_PAIRED;
}

/* An end of an activated connection takes its PAIRED state (as settle_client). */
static __always_inline __u32 adopt_settle(struct ez_sock *es)
{
	struct ez_adopt *a = adopt_record(es);

	if (a && a->state == EZ_ADOPT_PAIRED && es->state == EZ_SOCK_ADOPT_IN) {
		es->state = EZ_SOCK_PAIRED;
		es->flags |= EZ_F_UNREAD_REF | EZ_F_ADOPTED;
	}
	return es->state;
}

/*
 * A paired adopted end sent bytes through the stack: a thread that loaded
 * the old sk_prot before the insert (no hook here can see it in flight).
 * Those bytes go to the peer's TCP receive queue, which tcp_bpf_recvmsg
 * reads after the psock queue: a later redirect of this end would overtake
 * them. So the connection switches to the kernel path now, for good, as
 * backpressure does (unread.h): every later send of either end takes the
 * stack, and what was redirected before is read first. Sends are
 * serialised by the socket lock, and this end's redirects before the stack
 * send were committed to the stream before it, so the order read is the
 * order sent. Counted once per connection.
 */
static __always_inline void adopt_switch_late(struct ez_unread *u)
{
	if (__sync_val_compare_and_swap(&u->switched, 0, 1) == 0)
		adopt_count(EZ_A_LATE_STACK);
}

/* Both ends leave ez_sc_sockets (deleting another socket is what userspace's delete does). */
static __always_inline void adopt_unlink(struct ez_sock *es)
{
	__u64 self = es->self_cookie, peer = es->peer_cookie;

	if (!bpf_map_delete_elem(&ez_sc_sockets, &self))
		count(EZ_C_SOCKETS_RELEASED);
	if (peer && !bpf_map_delete_elem(&ez_sc_sockets, &peer))
		count(EZ_C_SOCKETS_RELEASED);
	es->state = EZ_SOCK_SEEN;
	es->flags &= ~(EZ_F_CLIENT | EZ_F_SERVER);
	es->peer_cookie = 0;
}

/*
 * sockops, for an adopting end: a data or FIN segment is about to leave
 * (HDR_OPT_LEN_CB runs in tcp_established_options, before the segment is
 * handed to IP), or the state changed. Unless the connection was activated,
 * it is aborted and both ends leave the sockhash now, before the segment can
 * reach the peer. Returns true when the caller should handle the socket as
 * paired. Quirk: the callback is skipped when the options already fill 40
 * bytes (timestamps + 3 SACK blocks, MD5): the checks below refuse sockets
 * with 3 SACK blocks pending and MD5 keys.
 */
static __always_inline bool adopt_on_sockops(struct bpf_sock_ops *skops, struct ez_sock *es, bool state_change)
{
	struct ez_adopt *a = adopt_record(es);

	if (a && a->state == EZ_ADOPT_PAIRED) {
		adopt_settle(es);
		return es->state == EZ_SOCK_PAIRED;
	}
	/* Incoming segments (PARSE_HDR_OPT_CB, skb_len counts the header) are
	 * the peer's outgoing ones: its own tripwire handled them. */
	if (!state_change && EZ_SOCKOPS_U32(skops, op) != BPF_SOCK_OPS_HDR_OPT_LEN_CB)
		return false;
	if (!state_change && !EZ_SOCKOPS_U32(skops, skb_len) && !(EZ_SOCKOPS_U32(skops, skb_tcp_flags) & 0x01 /* FIN */))
		return false; /* pure ACK or window update: carries no byte */
	if (a && !adopt_abort(a, EZ_A_SKIP_BUSY)) {
		adopt_settle(es);
		return es->state == EZ_SOCK_PAIRED;
	}
	adopt_unlink(es);
	bpf_sock_ops_cb_flags_set(skops, EZ_SOCKOPS_U32(skops, bpf_sock_ops_cb_flags) & ~EZ_ADOPT_CB_FLAGS);
	return false;
}

/* Whether an ez_sc_sockops attachment covers tp's cgroup. */
static __always_inline bool adopt_hooked(struct tcp_sock *tp)
{
	return cgroup_lookup(tp, &ez_sc_adopt_hooks, EZ_ADOPT_HOOK_DEPTH) != NULL;
}

static __always_inline __u64 adopt_cgroup_id(struct tcp_sock *tp)
{
	return BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.sk_cgrp_data.cgroup, kn, id);
}

/*
 * Whether a wait queue has an entry with a task behind it. Quirk: epoll's
 * entries (init_waitqueue_func_entry(ep_poll_callback)) have private ==
 * NULL and are harmless, epoll re-polls through sk_prot; a thread blocked in
 * recv/send/splice (DEFINE_WAIT_FUNC: private = current), poll/select
 * (private = its table) and io_uring (its request) are not: a thread asleep
 * in plain tcp_recvmsg would never see a redirected byte. The list is read
 * without its lock (probe reads): a heuristic the post-insert recheck and
 * the lock-waiter check back up. List ends are found without pointer
 * comparisons to the socket: head == head->next->prev.
 */
static __always_inline bool wq_has_sleeper(struct wait_queue_head *wqh)
{
	struct list_head *first, *head, *pos;

	first = BPF_CORE_READ(wqh, head.next);
	if (!first)
		return false;
	head = BPF_CORE_READ(first, prev);
	pos = first;
	for (int i = 0; i < EZ_ADOPT_WQ_SCAN; i++) {
		struct wait_queue_entry *e;

		if (pos == head)
			return false;
		e = container_of(pos, struct wait_queue_entry, entry);
		if (BPF_CORE_READ(e, private))
			return true;
		pos = BPF_CORE_READ(pos, next);
	}
	return true;
}

/* A thread sleeps on the socket, or waits for its lock (which we hold). */
static __always_inline bool adopt_sleepers(struct sock *sk)
{
	struct socket_wq *wq = BPF_CORE_READ(sk, sk_wq);

	if (wq_has_sleeper(&sk->sk_lock.wq))
		return true;
	return wq && wq_has_sleeper(&wq->wait);
}

/* enum ez_adopt_busy bits of a socket the iterator holds locked; 0: quiet. */
static __always_inline __u32 adopt_busy(struct tcp_sock *tp)
{
	struct sock *sk = (struct sock *)tp;
	__u32 busy = 0;

	if (tp->write_seq != tp->snd_una)
		busy |= EZ_AB_UNACKED;
	if (tp->rcv_nxt != tp->copied_seq || BPF_CORE_READ(sk, sk_receive_queue.qlen))
		busy |= EZ_AB_UNREAD;
	if (BPF_CORE_READ(tp, out_of_order_queue.rb_node))
		busy |= EZ_AB_QUEUED;
	if (BPF_CORE_READ(sk, sk_backlog.tail))
		busy |= EZ_AB_QUEUED;
	/* tcp_established_options: timestamps (12) + SACK base (4) + 3 blocks
	 * (24) = 40 leave no room, and HDR_OPT_LEN_CB is skipped. One or two
	 * blocks leave room; more need the peer to send, which trips its wire. */
	if (BPF_CORE_READ(tp, rx_opt.num_sacks) + BPF_CORE_READ_BITFIELD_PROBED(&tp->rx_opt, dsack) >= 3)
		busy |= EZ_AB_SACK;
	if (adopt_sleepers(sk))
		busy |= EZ_AB_SLEEPER;
	if (BPF_CORE_READ(sk, sk_shutdown) || BPF_CORE_READ(sk, sk_err) || BPF_CORE_READ(tp, urg_data))
		busy |= EZ_AB_CLOSING;
	if (BPF_CORE_READ(sk, sk_user_data) || BPF_CORE_READ(tp, inet_conn.icsk_ulp_ops) ||
	    BPF_CORE_READ_BITFIELD_PROBED(tp, repair))
		busy |= EZ_AB_UNSUPPORTED;
	if (bpf_core_field_exists(tp->md5sig_info) && BPF_CORE_READ(tp, md5sig_info))
		busy |= EZ_AB_UNSUPPORTED;
	return busy;
}

static __always_inline __u32 busy_reason(__u32 busy)
{
	if (busy & (EZ_AB_CLOSING | EZ_AB_UNSUPPORTED))
		return EZ_A_SKIP_UNSUPPORTED;
	return EZ_A_SKIP_BUSY;
}

/* An adopting end whose round ended without pairing: back to the kernel path. */
static __always_inline void adopt_cleanup(struct tcp_sock *tp, struct ez_sock *es)
{
	int flags = tp->bpf_sock_ops_cb_flags & ~EZ_ADOPT_CB_FLAGS;

	index_del(es->self_cookie);
	adopt_unlink(es);
	bpf_setsockopt(tp, EZ_SOL_TCP, EZ_TCP_BPF_SOCK_OPS_CB_FLAGS, &flags, sizeof(flags));
}

/* CANDIDATE: this end is quiet under its lock; from now on it trips. */
static __always_inline void adopt_confirm(struct tcp_sock *tp, struct ez_adopt *a, __u32 role, __u64 cookie)
{
	struct sock *sk = (struct sock *)tp;
	struct ez_cgroup *scope = NULL;
	struct ez_sock *es;
	__u32 bit = 1u << role, busy, old;
	int flags;

	if (a->confirmed & bit)
		return;
	if (draining()) {
		adopt_abort(a, EZ_A_SKIP_UNSUPPORTED);
		return;
	}
	if (!key_selected(&a->key) || !scope_selected_tp(tp, &scope)) {
		adopt_abort(a, EZ_A_SKIP_EXCLUDED);
		return;
	}
	if (!coverage_gate_sk(sk)) {
		adopt_abort(a, EZ_A_SKIP_UNCOVERED);
		return;
	}
	busy = adopt_busy(tp);
	if (busy) {
		adopt_abort(a, busy_reason(busy));
		return;
	}
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!es || (es->state != EZ_SOCK_SEEN && es->state != EZ_SOCK_KERNEL)) {
		adopt_abort(a, EZ_A_SKIP_UNSUPPORTED);
		return;
	}
	flags = tp->bpf_sock_ops_cb_flags | EZ_ADOPT_CB_FLAGS;
	if (bpf_setsockopt(tp, EZ_SOL_TCP, EZ_TCP_BPF_SOCK_OPS_CB_FLAGS, &flags, sizeof(flags))) {
		adopt_abort(a, EZ_A_SKIP_UNSUPPORTED);
		return;
	}
	es->self_cookie = cookie;
	es->peer_cookie = a->cookie[role ^ 1];
	es->key = a->key;
	es->flags = (es->flags & ~(EZ_F_CLIENT | EZ_F_SERVER | EZ_F_UNREAD_REF)) | (role ? EZ_F_SERVER : EZ_F_CLIENT);
	es->state = EZ_SOCK_ADOPT_ARMED;
	a->bound[role & 1] = tp_rx_bound(tp);
	old = __sync_fetch_and_or(&a->confirmed, bit);
	if ((old | bit) == 3)
		__sync_val_compare_and_swap(&a->state, EZ_ADOPT_CANDIDATE, EZ_ADOPT_CONFIRMED);
}

/* CONFIRMED or ONE_IN: into the sockhash; the second end activates. */
static __always_inline void adopt_insert(struct tcp_sock *tp, struct ez_sock *es, struct ez_adopt *a, __u32 role,
					 __u64 cookie)
{
	struct ez_unread urec = { .refs = 2 };
	struct sock *sk = (struct sock *)tp;
	struct ez_cgroup *scope = NULL;
	__u32 bit = 1u << role, busy, old;
	__u64 ukey;
	long err;

	if (a->inserted & bit)
		return;
	if (!es || es->state != EZ_SOCK_ADOPT_ARMED || es->self_cookie != cookie || draining()) {
		adopt_abort(a, EZ_A_SKIP_BUSY); /* tripped and cleaned up since its confirm */
		goto cleanup;
	}
	busy = adopt_busy(tp);
	if (busy) {
		adopt_abort(a, busy_reason(busy));
		goto cleanup;
	}
	err = bpf_map_update_elem(&ez_sc_sockets, &cookie, sk, BPF_NOEXIST);
	if (err) {
		adopt_abort(a, EZ_A_SKIP_UNSUPPORTED);
		count_insert_error(err);
		goto cleanup;
	}
	es->state = EZ_SOCK_ADOPT_IN;
	index_add(tp, es, cookie, a->cookie[role ^ 1], EZ_F_ADOPTED);
	/* The insert swapped sk_prot. A thread that loaded the old one before
	 * (in inet_recvmsg/inet_sendmsg) now sleeps or waits for our lock. */
	if (adopt_sleepers(sk)) {
		adopt_abort(a, EZ_A_SKIP_BUSY);
		goto cleanup;
	}
	scope_selected_tp(tp, &scope);
	old = __sync_fetch_and_or(&a->inserted, bit);
	if ((old | bit) != 3) {
		if (__sync_val_compare_and_swap(&a->state, EZ_ADOPT_CONFIRMED, EZ_ADOPT_ONE_IN) != EZ_ADOPT_CONFIRMED)
			goto cleanup;
		count(EZ_C_SOCKETS_ENROLLED);
		scope_count(scope);
		return;
	}
	/* Second end: activate. The unread record exists before PAIRED is visible. */
	ukey = a->cookie[0];
	urec.bound[0] = a->bound[1];
	urec.bound[1] = a->bound[0];
	if (bpf_map_update_elem(&ez_sc_unreads, &ukey, &urec, BPF_NOEXIST)) {
		adopt_abort(a, EZ_A_SKIP_UNSUPPORTED);
		goto cleanup;
	}
	if (__sync_val_compare_and_swap(&a->state, EZ_ADOPT_ONE_IN, EZ_ADOPT_PAIRED) != EZ_ADOPT_ONE_IN) {
		delete_record(&ez_sc_unreads, &ukey);
		goto cleanup;
	}
	es->state = EZ_SOCK_PAIRED;
	es->flags |= EZ_F_UNREAD_REF | EZ_F_ADOPTED;
	count(EZ_C_SOCKETS_ENROLLED);
	count(EZ_C_PAIRS);
	scope_count(scope);
	adopt_count(EZ_A_ADOPTED);
	return;
cleanup:
	if (es && adopting(es))
		adopt_cleanup(tp, es);
}

#endif
