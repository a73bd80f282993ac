/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * iter/sockmap: hands sockets back to the kernel path during uninstall. Run
 * by the agent after draining is set and in-flight redirects had time to
 * land: removes from ez_sockets every socket whose psock queue is empty
 * (removing one with queued bytes would discard them, sk_psock_destroy).
 * Iterators may delete from a sockhash (may_update_sockmap: BPF_TRACE_ITER).
 */
#ifndef EZ_SHORTCUT_RELEASE_H
#define EZ_SHORTCUT_RELEASE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "shortcut/maps.h"
#include "shortcut/unread.h"


SEC("iter/sockmap")
int ez_release(struct bpf_iter__sockmap *ctx)
{
	struct sock *sk = ctx->sk;
	__u64 *key = ctx->key;
	__u64 cookie;

	if (!sk || !key)
		return 0;
	/* Masked with ~3 this read psock->state (never 0): see unread.h. */
	if (psock_queued(sk))
		return 0; /* the application has not read everything yet: next pass */
	cookie = *key;
	if (!bpf_map_delete_elem(&ez_sockets, &cookie))
		count(EZ_C_SOCKETS_RELEASED);
	return 0;
}

/*
 * iter/sockmap, run by the agent every ~100 ms: the backstop of sockops'
 * on_segment, which needs a segment in or out. Removes each end of a
 * switched connection once nothing redirected to it is unread (may_leave).
 * A client still waiting for its outcome is left to sockops, which settles it.
 */
SEC("iter/sockmap")
int ez_release_switched(struct bpf_iter__sockmap *ctx)
{
	struct sock *sk = ctx->sk;
	__u64 *key = ctx->key;
	struct ez_unread *u;
	struct ez_sock *es;
	__u64 ukey, cookie;
	char one = 1;

	if (!sk || !key)
		return 0;
	es = bpf_sk_storage_get(&ez_socks, sk, 0, 0);
	if (!es || es->state != EZ_SOCK_PAIRED)
		return 0;
	ukey = unread_key(es);
	u = bpf_map_lookup_elem(&ez_unreads, &ukey);
	if (!u || !u->switched)
		return 0;
	cookie = *key;
	if (may_leave(u, es, sk) && !bpf_map_delete_elem(&ez_sockets, &cookie)) {
		es->state = EZ_SOCK_LEFT;
		count(EZ_C_SOCKETS_RELEASED);
		return 0;
	}
	/* Still holds unread bytes: one byte tells the agent to pass again. */
	bpf_seq_write(ctx->meta->seq, &one, 1);
	return 0;
}

#endif
