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


/* include/net/sock.h: sk_user_data carries three flag bits (NOCOPY 1, BPF 2,
 * PSOCK 4) and SK_USER_DATA_PTRMASK is ~7. Masking with ~3 left PSOCK set and
 * read msg_tot_len 4 bytes off (psock->state, never 0): no live socket was
 * ever released, and uninstall waited for applications to close. */
#define EZ_SK_USER_DATA_PTRMASK (~7UL)

SEC("iter/sockmap")
int ez_release(struct bpf_iter__sockmap *ctx)
{
	struct sock *sk = ctx->sk;
	__u64 *key = ctx->key;
	struct sk_psock *psock;
	__u64 cookie;

	if (!sk || !key)
		return 0;
	psock = (struct sk_psock *)((unsigned long)BPF_CORE_READ(sk, sk_user_data) & EZ_SK_USER_DATA_PTRMASK);
	if (psock && BPF_CORE_READ(psock, msg_tot_len))
		return 0; /* the application has not read everything yet: next pass */
	cookie = *key;
	if (!bpf_map_delete_elem(&ez_sockets, &cookie))
		count(EZ_C_SOCKETS_RELEASED);
	return 0;
}

#endif
