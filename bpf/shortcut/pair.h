/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Operations on pairing records (struct ez_pair) shared by the programs. */
#ifndef EZ_SHORTCUT_PAIR_H
#define EZ_SHORTCUT_PAIR_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "shortcut/control.h"

/* Moves a record not yet decided (SYN, CLAIMING, CLIENT) to AMBIGUOUS. Returns the state found. */
static __always_inline __u32 pair_make_ambiguous(struct ez_pair *p)
{
	__u32 old = p->state;

#pragma unroll
	for (int i = 0; i < 3; i++) {
		if (old != EZ_PAIR_SYN && old != EZ_PAIR_CLAIMING && old != EZ_PAIR_CLIENT)
			return old;
		__u32 seen = __sync_val_compare_and_swap(&p->state, old, EZ_PAIR_AMBIGUOUS);
		if (seen == old)
			return old;
		old = seen;
	}
	return old;
}

/*
 * Deletes a record that is done with, and its proof first: a record of the
 * same key created after the delete gets a proof of its own.
 */
static __always_inline void pair_delete(const struct ez_conn_key *key)
{
	bpf_map_delete_elem(&ez_sc_proofs, key);
	delete_record(&ez_sc_pairs, key);
}

/*
 * Did this record's handshake make the socket? isn's are the socket's own
 * initial sequence numbers, read at its ESTABLISHED callback, where neither
 * end has sent or received anything past the SYNs: the client in
 * tcp_finish_connect (rcv_nxt = the SYN-ACK's seq + 1 set just before,
 * snd_nxt = its ISN + 1 without SYN data), the server in
 * tcp_rcv_state_process's SYN_RECV case (tcp_create_openreq_child set
 * snd_nxt = snt_isn + 1, rcv_nxt = rcv_isn + 1; the ACK's data is queued
 * after the callback). Syncookies rebuild both from the ACK
 * (cookie_v4_check: snt_isn = ack_seq - 1, rcv_isn = seq - 1), the ISNs the
 * cookie SYN-ACK carried. Guessing both takes what a blind injection into
 * the connection would take (RFC 6528 ISNs), and a record allows
 * EZ_PAIR_MAX_UNPROVEN wrong tries.
 */
static __always_inline bool pair_proven(const struct ez_pair *p, const struct ez_conn_key *key, __u32 client_isn,
					__u32 server_isn)
{
	struct ez_pair_proof *pr;

	if (!p->proven)
		return false;
	pr = bpf_map_lookup_elem(&ez_sc_proofs, key);
	return pr && pr->client_isn == client_isn && pr->server_isn == server_isn;
}

/*
 * A socket with this record's tuple but not its handshake: it does not touch
 * the record, which stays for its own ends. Counted; after
 * EZ_PAIR_MAX_UNPROVEN such sockets the record stops pairing (a brute force
 * of the ISNs: whoever can try has the exact tuple during the handshake,
 * which makes the record AMBIGUOUS anyway).
 */
/*
 * Where no SYN-ACK proved the record, the claiming client leaves its own
 * ISNs as the proof, and the server pairs only if they are its own too
 * (pair_claim_matches at its ESTABLISHED). Quirk: Linux 6.1 runs no cgroup
 * egress program for an IPv6 SYN-ACK: tcp_v6_send_synack hands the listener
 * to ip6_xmit while skb->sk is the request socket, and
 * BPF_CGROUP_RUN_PROG_INET_EGRESS runs only when sk == skb->sk. Written
 * between CLAIMING and CLIENT: the server reads it after it saw CLIENT.
 */
static __always_inline void pair_claim_proof(const struct ez_pair *p, const struct ez_conn_key *key, __u32 client_isn,
					     __u32 server_isn)
{
	struct ez_pair_proof proof = { .client_isn = client_isn, .server_isn = server_isn };

	if (!p->proven)
		bpf_map_update_elem(&ez_sc_proofs, key, &proof, BPF_ANY);
}

/* Whether the proof its client left holds the server's own ISNs (an
 * evicted proof does not: the connection stays on the kernel path). */
static __always_inline bool pair_claim_matches(const struct ez_conn_key *key, __u32 client_isn, __u32 server_isn)
{
	struct ez_pair_proof *pr = bpf_map_lookup_elem(&ez_sc_proofs, key);

	return pr && pr->client_isn == client_isn && pr->server_isn == server_isn;
}

static __always_inline void pair_refuse(struct ez_pair *p, const struct ez_conn_key *key)
{
	struct ez_pair_proof *pr = p->proven ? bpf_map_lookup_elem(&ez_sc_proofs, key) : NULL;

	if (pr && __sync_fetch_and_add(&pr->unproven, 1) + 1 >= EZ_PAIR_MAX_UNPROVEN)
		pair_make_ambiguous(p);
	count(EZ_C_FB_UNPROVEN);
}

/*
 * The record a client claims: under the client's own key, or, when NAT in
 * the server's namespace rewrote the SYN, through the alias the SYN-ACK left.
 * Rewrites es->key to the record's key and sets *via_alias. An alias older
 * than our first SYN belongs to another handshake and is not followed. The
 * claim deletes the alias it followed once the record is proven ours: one
 * that leads to another handshake's record stays for its own client.
 */
static __always_inline struct ez_pair *lookup_pair_for_client(struct ez_sock *es, bool *via_alias)
{
	struct ez_pair *p = bpf_map_lookup_elem(&ez_sc_pairs, &es->key);
	struct ez_conn_key target;
	struct ez_alias *a;

	*via_alias = false;
	if (p)
		return p;
	a = bpf_map_lookup_elem(&ez_sc_aliases, &es->key);
	if (!a)
		return NULL;
	if (es->syn_ns && a->created_ns < es->syn_ns)
		return NULL; /* another handshake's, or poisoned (created_ns 0) */
	target = a->target;
	*via_alias = true;
	p = bpf_map_lookup_elem(&ez_sc_pairs, &target);
	if (p)
		es->key = target;
	return p;
}

#endif
