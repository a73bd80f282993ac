/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sockops: the pairing protocol. Both ends of a node-local connection are
 * enrolled only when both live in managed cgroups, and the connection's path
 * is decided exactly once, by one cmpxchg on its ez_pair record:
 *
 *   listener sees the SYN   -> record SYN                  (BPF_NOEXIST)
 *   client ESTABLISHED      -> client into ez_sc_sockets; SYN -> CLIENT
 *   server ESTABLISHED      -> server into ez_sc_sockets; CLIENT -> PAIRED
 *   client's first sendmsg  -> CLIENT -> KERNEL (server not there yet); the
 *                              server's ESTABLISHED then removes the client
 *                              from ez_sc_sockets before any byte can reach it
 *                              through the stack
 *
 * Quirk: sockops may look a socket up in a sockhash but has no bpf_sk_release,
 * so the verifier rejects the lookup; the two ends meet only through this
 * record, never through each other's sk_storage.
 */
#ifndef EZ_SHORTCUT_SOCKOPS_H
#define EZ_SHORTCUT_SOCKOPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "shortcut/key.h"
#include "shortcut/control.h"
#include "shortcut/pair.h"
#include "shortcut/scope.h"
#include "shortcut/select.h"
#include "shortcut/unread.h"
#include "shortcut/splice.h"
#include "shortcut/adopt.h"
#include "shortcut/coverage.h"
#include "shortcut/index.h"

/* Callbacks an enrolled socket asks for: its state changes, and every
 * segment in and out (on_segment). Set at enrolment rather than at the
 * switch, which sk_msg cannot do: a paired socket has no segments. */
#define EZ_SEGMENT_CB_FLAGS (BPF_SOCK_OPS_PARSE_ALL_HDR_OPT_CB_FLAG | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG)
#define EZ_ENROLLED_CB_FLAGS (BPF_SOCK_OPS_STATE_CB_FLAG | EZ_SEGMENT_CB_FLAGS)

static __always_inline void syn_index_key(struct ez_syn_index *ix, const struct ez_conn_key *k, __u64 netns)
{
	ix->netns = netns;
	__builtin_memcpy(ix->client_ip, k->client_ip, 16);
	ix->client_port = k->client_port;
	ix->listener_port = k->server_port;
}

/*
 * Lets the SYN-ACK find this record (shortcut/egress.h on_synack), which
 * proves it: the listener's scope and the handshake's ISNs. Returns false
 * when the record was dropped.
 */
static __always_inline bool index_syn(struct bpf_sock_ops *skops, const struct ez_conn_key *key, __u64 now)
{
	struct ez_alias target = { .created_ns = now, .target = *key };
	struct ez_syn_index ix = {};
	struct ez_alias *old;

	long err;

	syn_index_key(&ix, key, bpf_get_netns_cookie(skops));
	err = bpf_map_update_elem(&ez_sc_syn_index, &ix, &target, BPF_NOEXIST);
	if (!err)
		return true;
	if (err != -EEXIST) {
		/* No way for the SYN-ACK to prove the record: drop it. */
		count_insert_error(err);
		delete_record(&ez_sc_pairs, key);
		return false;
	}
	/* One client ip:port to two addresses of one listener at once: the
	 * SYN-ACKs cannot tell them apart, so neither proves its record (both
	 * stay unproven until aged) nor learns NAT. */
	old = bpf_map_lookup_elem(&ez_sc_syn_index, &ix);
	if (old)
		old->created_ns = 0;
	count(EZ_C_FB_AMBIGUOUS);
	return true;
}

/*
 * Listener, SYN received: runs for the request socket (is_fullsock == 0) in
 * the listener's cgroup. Quirk: skops->sk is NULL for a request socket
 * (SOCK_OPS_GET_SK tests is_fullsock), so neither the request socket's ISNs
 * (tcp_request_sock rcv_isn, snt_isn: both set before tcp_openreq_init_rwin
 * runs this) nor the listener's cgroup can be read here. The record is
 * registered unproven; the listener's SYN-ACK, which leaves through the
 * egress program before any client can claim, proves it with both ISNs and
 * the listener's scope, or removes it (egress.h on_synack).
 */
static __always_inline void on_syn(struct bpf_sock_ops *skops)
{
	struct ez_pair rec = { .created_ns = bpf_ktime_get_ns(), .state = EZ_PAIR_SYN };
	struct ez_conn_key key = {};
	struct ez_pair *old;
	long err;

	key_from_sockops(skops, &key, true);
	if (!key_selected(&key))
		return; /* counted by the client, if it is managed */
	err = bpf_map_update_elem(&ez_sc_pairs, &key, &rec, BPF_NOEXIST);
	if (!err) {
		index_syn(skops, &key, rec.created_ns); /* counted once proven */
		return;
	}
	if (err != -EEXIST) {
		count_insert_error(err);
		return;
	}
	/* Two handshakes for one key at once (namespaces with overlapping
	 * addresses): neither may pair. A decided record (PAIRED, KERNEL) is left
	 * alone, only the new handshake goes unaccelerated. AMBIGUOUS records stay
	 * until the agent ages them out, so a third handshake cannot claim them. */
	old = bpf_map_lookup_elem(&ez_sc_pairs, &key);
	if (old)
		pair_make_ambiguous(old);
	count(EZ_C_FB_AMBIGUOUS);
}

/* Client ESTABLISHED (SYN-ACK received, so a managed server already registered the SYN). */
static __always_inline void on_client_established(struct bpf_sock_ops *skops)
{
	struct ez_cgroup *scope = NULL;
	struct bpf_sock *sk = skops->sk;
	__u32 client_isn, server_isn;
	struct ez_conn_key wire;
	struct ez_sock *es;
	struct ez_pair *p;
	bool via_alias;
	__u64 cookie;
	long err;

	if (!sk)
		return;
	/* Nothing sent or received past the SYNs yet (pair_proven). */
	client_isn = EZ_SOCKOPS_U32(skops, snd_nxt) - 1;
	server_isn = EZ_SOCKOPS_U32(skops, rcv_nxt) - 1;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!es) {
		count(EZ_C_FB_NO_STORAGE);
		return;
	}
	if (es->flags & EZ_F_SYN_DATA) {
		count(EZ_C_FB_SYN_DATA);
		return;
	}
	/* Without the egress program's view of the SYN only the socket's own
	 * (pre-NAT) tuple is known; it still finds a server reached without NAT. */
	if (!(es->flags & EZ_F_SYN_SEEN))
		key_from_sockops(skops, &es->key, false);
	else
		es->key.netns = key_needs_netns(&es->key) ? bpf_get_netns_cookie(skops) : 0;
	wire = es->key;
	p = lookup_pair_for_client(es, &via_alias);
	if (!key_selected(&es->key) || !scope_selected(sk, &scope)) {
		count(EZ_C_FB_EXCLUDED);
		return;
	}
	if (!coverage_gate(skops))
		return;
	if (!p) {
		count(EZ_C_FB_NO_LOCAL_PEER);
		return;
	}
	/* Another handshake's record for our tuple (a listener in another
	 * namespace with our addresses, a forged SYN): not ours to claim, nor
	 * to spoil for its own client. */
	if (p->proven && !pair_proven(p, &es->key, client_isn, server_isn)) {
		pair_refuse(p, &es->key);
		return;
	}
	/* A record registered before our first SYN left belongs to another handshake. */
	if (es->syn_ns && p->created_ns < es->syn_ns) {
		pair_make_ambiguous(p);
		count(EZ_C_FB_AMBIGUOUS);
		return;
	}
	/* Followed once: the alias has served its only client. */
	if (via_alias)
		bpf_map_delete_elem(&ez_sc_aliases, &wire);
	cookie = bpf_get_socket_cookie(skops);
	es->self_cookie = cookie;
	es->flags |= EZ_F_CLIENT;
	es->state = EZ_SOCK_WAITING;
	err = bpf_sock_hash_update(skops, &ez_sc_sockets, &cookie, BPF_NOEXIST);
	if (err) {
		es->state = EZ_SOCK_KERNEL;
		count_insert_error(err);
		return;
	}
	rx_sock_register(sk, cookie); /* before the server can redirect to us */
	if (__sync_val_compare_and_swap(&p->state, EZ_PAIR_SYN, EZ_PAIR_CLAIMING) != EZ_PAIR_SYN)
		goto ambiguous;
	pair_claim_proof(p, &es->key, client_isn, server_isn);
	p->client_cookie = cookie;
	p->client_rx_bound = sock_rx_bound(sk);
	if (__sync_val_compare_and_swap(&p->state, EZ_PAIR_CLAIMING, EZ_PAIR_CLIENT) != EZ_PAIR_CLAIMING)
		goto ambiguous;
	index_add_sk(sk, es, cookie, 0); /* the server's entry names its peer */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | EZ_ENROLLED_CB_FLAGS);
	count(EZ_C_SOCKETS_ENROLLED);
	coverage_count(skops);
	scope_count(scope);
	return;
ambiguous:
	pair_make_ambiguous(p);
	es->state = EZ_SOCK_KERNEL;
	bpf_map_delete_elem(&ez_sc_sockets, &cookie);
	count(EZ_C_FB_AMBIGUOUS);
}

/* Server ESTABLISHED (the client's ACK created the accepted socket; no data received yet). */
static __always_inline void on_server_established(struct bpf_sock_ops *skops)
{
	struct ez_unread urec = { .refs = 2 };
	struct ez_cgroup *scope = NULL;
	struct bpf_sock *sk = skops->sk;
	struct ez_conn_key key = {};
	__u64 ccookie, cookie;
	struct ez_sock *ses;
	struct ez_pair *p;
	__u32 old;
	long err;

	if (!sk)
		return;
	key_from_sockops(skops, &key, true);
	p = bpf_map_lookup_elem(&ez_sc_pairs, &key);
	if (!p)
		return;
	/* Only the socket of the record's own handshake may decide it: one
	 * with our tuple but other ISNs (another namespace's listener with the
	 * same addresses, a syncookie ACK forged after its SYN's record was
	 * gone) leaves it alone. */
	if (p->proven && !pair_proven(p, &key, EZ_SOCKOPS_U32(skops, rcv_nxt) - 1, EZ_SOCKOPS_U32(skops, snd_nxt) - 1)) {
		pair_refuse(p, &key);
		return;
	}
	/* The client claims at its ESTABLISHED, before sending the ACK that
	 * created us: SYN here means no managed client exists. */
	old = __sync_val_compare_and_swap(&p->state, EZ_PAIR_SYN, EZ_PAIR_KERNEL);
	if (p->has_alias)
		bpf_map_delete_elem(&ez_sc_aliases, &p->alias);
	{
		struct ez_syn_index ix = {};

		syn_index_key(&ix, &key, bpf_get_netns_cookie(skops));
		bpf_map_delete_elem(&ez_sc_syn_index, &ix);
	}
	if (old == EZ_PAIR_SYN) {
		pair_delete(&key);
		count(EZ_C_FB_NO_LOCAL_PEER);
		return;
	}
	ccookie = p->client_cookie;
	if (old == EZ_PAIR_AMBIGUOUS) {
		/* The client may sit in the sockhash; nobody redirected to it. The
		 * record stays for the agent to age out. */
		if (ccookie)
			bpf_map_delete_elem(&ez_sc_sockets, &ccookie);
		count(EZ_C_FB_AMBIGUOUS);
		return;
	}
	if (old != EZ_PAIR_CLIENT)
		goto release_client; /* KERNEL: the client wrote before we existed */
	/* No SYN-ACK proved the record (pair_claim_proof): the client that
	 * claimed it must have our handshake's ISNs, or it is someone else's. */
	if (!p->proven && !pair_claim_matches(&key, EZ_SOCKOPS_U32(skops, rcv_nxt) - 1, EZ_SOCKOPS_U32(skops, snd_nxt) - 1)) {
		count(EZ_C_FB_UNPROVEN);
		goto decide_kernel;
	}
	if (!scope_selected(sk, &scope)) {
		count(EZ_C_FB_EXCLUDED); /* a selected client, a server outside the scope */
		goto decide_kernel;
	}
	if (!coverage_gate(skops))
		goto decide_kernel;
	if (skops->bytes_received) {
		count(EZ_C_FB_SYN_DATA);
		goto decide_kernel;
	}
	ses = bpf_sk_storage_get(&ez_sc_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!ses) {
		count(EZ_C_FB_NO_STORAGE);
		goto decide_kernel;
	}
	cookie = bpf_get_socket_cookie(skops);
	ses->self_cookie = cookie;
	ses->peer_cookie = ccookie;
	ses->key = key;
	ses->flags |= EZ_F_SERVER;
	ses->state = EZ_SOCK_PAIRED;
	err = bpf_sock_hash_update(skops, &ez_sc_sockets, &cookie, BPF_NOEXIST);
	if (err) {
		ses->state = EZ_SOCK_KERNEL;
		count_insert_error(err);
		goto decide_kernel;
	}
	p->server_cookie = cookie;
	rx_sock_register(sk, cookie); /* before the client can redirect to us (PAIRED) */
	/* The unread record exists before anyone can redirect (PAIRED). */
	urec.bound[0] = sock_rx_bound(sk);
	urec.bound[1] = p->client_rx_bound ? p->client_rx_bound : EZ_UNREAD_AUTO_MAX;
	err = bpf_map_update_elem(&ez_sc_unreads, &ccookie, &urec, BPF_NOEXIST);
	if (err) {
		ses->state = EZ_SOCK_KERNEL;
		bpf_map_delete_elem(&ez_sc_sockets, &cookie);
		count_insert_error(err);
		goto decide_kernel;
	}
	if (__sync_val_compare_and_swap(&p->state, EZ_PAIR_CLIENT, EZ_PAIR_PAIRED) != EZ_PAIR_CLIENT) {
		/* The client wrote first and took the kernel path: so do we. */
		ses->state = EZ_SOCK_KERNEL;
		delete_record(&ez_sc_unreads, &ccookie);
		bpf_map_delete_elem(&ez_sc_sockets, &cookie);
		goto release_client;
	}
	/* LRU quirk (shortcut.bpf.c, ez_sc_pairs): the element may have been evicted and reused
	 * for another key since our lookup; then the PAIRED just written is
	 * not ours. Undone to AMBIGUOUS: that record's client settles KERNEL
	 * (its unread record, keyed by its own cookie, was never made). */
	if (bpf_map_lookup_elem(&ez_sc_pairs, &key) != p || p->client_cookie != ccookie) {
		__sync_val_compare_and_swap(&p->state, EZ_PAIR_PAIRED, EZ_PAIR_AMBIGUOUS);
		ses->state = EZ_SOCK_KERNEL;
		delete_record(&ez_sc_unreads, &ccookie);
		bpf_map_delete_elem(&ez_sc_sockets, &cookie);
		bpf_map_delete_elem(&ez_sc_sockets, &ccookie);
		count(EZ_C_FB_EVICTED);
		return;
	}
	ses->flags |= EZ_F_UNREAD_REF;
	index_add_sk(sk, ses, cookie, ccookie);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | EZ_ENROLLED_CB_FLAGS);
	/* The record stays until the client reads the outcome. */
	count(EZ_C_SOCKETS_ENROLLED);
	coverage_count(skops);
	count(EZ_C_PAIRS);
	scope_count(scope);
	return;

decide_kernel:
	if (__sync_val_compare_and_swap(&p->state, EZ_PAIR_CLIENT, EZ_PAIR_KERNEL) != EZ_PAIR_CLIENT)
		count(EZ_C_FB_EARLY_DATA);
release_client:
	/* Deleting another socket from the sockhash is what a delete from
	 * userspace does (sock_hash_delete_elem, psock dropped under
	 * sk_callback_lock). Nothing was redirected to the client, and nothing
	 * can reach it through the stack before this: we have not been accepted. */
	bpf_map_delete_elem(&ez_sc_sockets, &ccookie);
	pair_delete(&key);
	count(EZ_C_SOCKETS_RELEASED);
}

/*
 * A waiting client learns its connection's outcome, at its first sendmsg or
 * when it leaves ESTABLISHED. Quirk: sk_msg may not delete from a sockhash
 * ("cannot update sockmap in this context"), so a client that settles for the
 * kernel path stays enrolled, passing, until the server's ESTABLISHED removes
 * it: before that no byte can reach it through the stack.
 */
static __always_inline __u32 settle_client(struct ez_sock *es)
{
	struct ez_pair *p = bpf_map_lookup_elem(&ez_sc_pairs, &es->key);
	__u32 old;

	es->state = EZ_SOCK_KERNEL;
	if (!p || p->client_cookie != es->self_cookie) {
		/* The server decided KERNEL and removed us; or the record was
		 * evicted (LRU, shortcut.bpf.c) after the server paired: its unread
		 * record, keyed by our cookie, says so, and bytes it redirected
		 * may be in our psock. The connection switches to the kernel
		 * path as backpressure does (unread.h): both ends pass from
		 * now on and leave the sockhash once nothing is unread. */
		struct ez_unread *u = bpf_map_lookup_elem(&ez_sc_unreads, &es->self_cookie);

		if (!u)
			return EZ_SOCK_KERNEL;
		__sync_val_compare_and_swap(&u->switched, 0, 1);
		count(EZ_C_FB_EVICTED);
		es->state = EZ_SOCK_PAIRED;
		es->flags |= EZ_F_UNREAD_REF; /* the server took it for us */
		return EZ_SOCK_PAIRED;
	}
	old = __sync_val_compare_and_swap(&p->state, EZ_PAIR_CLIENT, EZ_PAIR_KERNEL);
	if (old == EZ_PAIR_PAIRED) {
		es->peer_cookie = p->server_cookie;
		es->state = EZ_SOCK_PAIRED;
		es->flags |= EZ_F_UNREAD_REF; /* the server took it for us */
		pair_delete(&es->key);
		return EZ_SOCK_PAIRED;
	}
	if (old == EZ_PAIR_CLIENT)
		count(EZ_C_FB_EARLY_DATA);
	return EZ_SOCK_KERNEL;
}

#define EZ_RCV_SHUTDOWN 1 /* include/net/sock.h */

/*
 * This end's own shutdown(SHUT_WR): tcp_shutdown -> tcp_close_state ->
 * tcp_set_state(FIN_WAIT1) runs STATE_CB synchronously inside shutdown(),
 * under the socket lock, before the FIN is sent and before the application's
 * next recv(). Kernel quirk behind it (stock 6.1 to 6.18): the ACK of that
 * FIN reaches tcp_rcv_state_process, case TCP_FIN_WAIT1: tcp_set_state
 * (FIN_WAIT2), then sk->sk_state_change (sock_def_wakeup,
 * wake_up_interruptible_all on sk_wq) "to wake up lingering close()". A
 * reader blocked in tcp_bpf_recvmsg sleeps on that queue (tcp_msg_wait_data
 * -> sk_wait_event -> wait_woken); woken with neither psock nor receive
 * queue holding data, tcp_msg_wait_data returns 0 and tcp_bpf_recvmsg
 * answers -EAGAIN on a blocking socket, where tcp_recvmsg's loop sleeps
 * again. The peer delays that ACK (tcp_fin enters pingpong mode) and sends
 * its replies through the redirect, not TCP, so the ACK comes alone ~40 ms
 * later (the delayed-ACK timer) whenever the peer takes that long to reply
 * and close: a blocking half-close client reads EAGAIN.
 * So the connection switches to the kernel path for good (as backpressure
 * does: unread.h), and this end leaves the sockhash now when nothing
 * redirected to it is unread (may_leave): deleting drops the psock
 * (sk_psock_drop restores tcp_prot), so its next recv() is tcp_recvmsg,
 * which sleeps on through a wake-up without data. Otherwise it leaves at
 * its next segment once it read them (on_segment), or at the agent's pass.
 * close() runs the same transition after sock_map_close dropped the psock,
 * with sk_shutdown = SHUTDOWN_MASK (__tcp_close); so does shutdown(SHUT_RDWR):
 * with RCV_SHUTDOWN set no read ever waits (tcp_msg_wait_data returns 1),
 * nothing to do, and close()'s RST-on-unread logic (closereset.h) is left as
 * it was.
 */
static __always_inline void on_half_close(struct ez_sock *es, struct bpf_sock *sk)
{
	struct ez_unread *u;
	struct tcp_sock *tp;
	__u64 key;

	if (es->state != EZ_SOCK_PAIRED)
		return;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	if (BPF_CORE_READ_BITFIELD_PROBED((struct sock *)tp, sk_shutdown) & EZ_RCV_SHUTDOWN)
		return;
	key = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &key);
	if (!u)
		return;
	/* Full barrier, then may_leave reads unread[]: a sender that saw
	 * switched == 0 has its bytes counted (skmsg.h). */
	if (__sync_val_compare_and_swap(&u->switched, 0, 1) == 0)
		count(EZ_C_FB_HALF_CLOSE);
	if (!may_leave(u, es, (struct sock *)tp))
		return;
	if (!bpf_map_delete_elem(&ez_sc_sockets, &es->self_cookie))
		count(EZ_C_SOCKETS_RELEASED);
	es->state = EZ_SOCK_LEFT;
}

/*
 * A socket's TCP state changed. A waiting client settles (and cleans up
 * what the server cannot); an end of a paired connection drops its
 * reference on the unread record when it reaches TCP_CLOSE (tcp_done: also
 * on the way to TIME_WAIT, and on reset).
 */
static __always_inline void on_state_change(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct ez_sock *es;

	if (!sk)
		return;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (adopting(es) && !adopt_on_sockops(skops, es, true))
		return;
	if (es && es->state == EZ_SOCK_WAITING && settle_client(es) == EZ_SOCK_KERNEL) {
		struct ez_pair *p = bpf_map_lookup_elem(&ez_sc_pairs, &es->key);

		bpf_map_delete_elem(&ez_sc_sockets, &es->self_cookie);
		if (p && p->client_cookie == es->self_cookie && p->state != EZ_PAIR_AMBIGUOUS)
			pair_delete(&es->key);
	}
	if (es && skops->args[0] == BPF_TCP_ESTABLISHED && skops->args[1] == BPF_TCP_FIN_WAIT1)
		on_half_close(es, sk);
	if (es && (es->flags & EZ_F_UNREAD_REF)) {
		if (skops->args[1] != BPF_TCP_CLOSE)
			return; /* keep the callback until the end */
		es->flags &= ~EZ_F_UNREAD_REF;
		unread_put(unread_key(es));
		/* Also after an upgrade from the gauge (rx_gauged). */
		bpf_map_delete_elem(&ez_sc_rx_socks, &es->self_cookie);
		bpf_map_delete_elem(&ez_sc_rx, &es->self_cookie);
	}
	/* Closed, or settled on the kernel path: out of the listing. */
	if (es)
		index_del(es->self_cookie);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags & ~EZ_ENROLLED_CB_FLAGS);
}

/*
 * A segment of an enrolled socket went in (PARSE_HDR_OPT_CB, from
 * tcp_validate_incoming) or is going out (HDR_OPT_LEN_CB; no option space is
 * reserved). Paired sockets exchange no segments: these run only once the
 * connection switched to the kernel path (or while it closes), and leave the
 * sockhash as soon as nothing redirected to this end is unread. sockops may
 * delete from a sockhash (may_update_sockmap), sk_msg and tracing may not.
 */
static __always_inline void on_segment(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct ez_unread *u;
	struct tcp_sock *tp;
	struct ez_sock *es;
	__u64 key;

	if (!sk)
		return;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (adopting(es) && !adopt_on_sockops(skops, es, false))
		return;
	/* A client that settled KERNEL in sk_msg (which may not delete from a
	 * sockhash) leaves it here, at its first segment after: the server's
	 * ESTABLISHED does it too, but finds no record once it was evicted
	 * (LRU, shortcut.bpf.c), and a socket left in the sockhash keeps tcp_bpf's
	 * recvmsg and ioctl. Nothing was redirected to it: its record never
	 * reached PAIRED, or it would have settled PAIRED. */
	if (es && es->state == EZ_SOCK_KERNEL && (es->flags & (EZ_F_CLIENT | EZ_F_ADOPTED)) == EZ_F_CLIENT) {
		/* Counted released by the server's release_client, if it finds the record. */
		bpf_map_delete_elem(&ez_sc_sockets, &es->self_cookie);
		goto done;
	}
	if (!es || (es->state != EZ_SOCK_PAIRED && es->state != EZ_SOCK_WAITING))
		goto done;
	key = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &key);
	if (!u) {
		if (es->state == EZ_SOCK_WAITING) {
			struct ez_pair *p = bpf_map_lookup_elem(&ez_sc_pairs, &es->key);

			if (p && p->client_cookie == es->self_cookie)
				return; /* not paired yet: the server creates the record */
			/* The record was evicted (LRU, shortcut.bpf.c) before the server
			 * paired, which it no longer can: kernel path, out of the
			 * sockhash (a waiting reader would otherwise keep tcp_bpf). */
			if (settle_client(es) == EZ_SOCK_KERNEL)
				bpf_map_delete_elem(&ez_sc_sockets, &es->self_cookie);
		}
		goto done;
	}
	/* An adopted socket sending data through the stack while its
	 * connection is on the shortcut: a send that raced the insert
	 * (docs/families/shortcut-design.md, Adoption residuals). Not while
	 * its direction is held on the kernel path for its receiver
	 * (splice.h, tx_gated). */
	if ((es->flags & EZ_F_ADOPTED) && EZ_SOCKOPS_U32(skops, op) == BPF_SOCK_OPS_HDR_OPT_LEN_CB && EZ_SOCKOPS_U32(skops, skb_len) &&
	    !u->switched && !draining() && sk->state == BPF_TCP_ESTABLISHED && !tx_gated(es))
		adopt_switch_late(u);
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp || !may_leave(u, es, (struct sock *)tp))
		return;
	/* A waiting client never sent: learn the outcome now (drops the pairing record). */
	if (es->state == EZ_SOCK_WAITING && settle_client(es) != EZ_SOCK_PAIRED)
		goto done;
	if (!bpf_map_delete_elem(&ez_sc_sockets, &es->self_cookie))
		count(EZ_C_SOCKETS_RELEASED);
	es->state = EZ_SOCK_LEFT;
done:
	/* Keep STATE_CB while holding the unread record. */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags & ~EZ_SEGMENT_CB_FLAGS);
}

#endif
