/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Operations on pairing records (struct ez_pair) shared by the programs. */
#ifndef EZ_SHORTCUT_PAIR_H
#define EZ_SHORTCUT_PAIR_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "shortcut/maps.h"


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
 * The record a client claims: under the client's own key, or, when NAT in
 * the server's namespace rewrote the SYN, through the alias the SYN-ACK left.
 * Rewrites es->key to the record's key. An alias older than our first SYN
 * belongs to another handshake and is not followed.
 */
static __always_inline struct ez_pair *lookup_pair_for_client(struct ez_sock *es)
{
	struct ez_pair *p = bpf_map_lookup_elem(&ez_sc_pairs, &es->key);
	struct ez_conn_key target;
	struct ez_alias *a;

	if (p)
		return p;
	a = bpf_map_lookup_elem(&ez_sc_aliases, &es->key);
	if (!a)
		return NULL;
	if (es->syn_ns && a->created_ns < es->syn_ns)
		return NULL; /* another handshake's, or poisoned (created_ns 0) */
	/* Followed once: the alias has served its only client. */
	target = a->target;
	bpf_map_delete_elem(&ez_sc_aliases, &es->key);
	es->key = target;
	return bpf_map_lookup_elem(&ez_sc_pairs, &es->key);
}

#endif
