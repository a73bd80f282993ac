/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Handing sockets back to the kernel path. Both programs are tc programs
 * that never see traffic: the agent runs them through BPF_PROG_TEST_RUN once
 * per socket of the sockhash, with the socket's cookie in the input packet
 * (enum ez_release_input), and reads an enum ez_release_result back. A tc
 * program may look a socket up in a sockhash and delete it
 * (may_update_sockmap: SCHED_CLS), in any network namespace. Not
 * iter/sockmap, which some kernels refuse to processes other than the
 * global PID 1 (docs/kernels.md).
 */
#ifndef EZ_SHORTCUT_RELEASE_H
#define EZ_SHORTCUT_RELEASE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "shortcut/maps.h"
#include "shortcut/unread.h"

/* The socket whose cookie the input packet carries, referenced (release it). */
static __always_inline struct bpf_sock *release_lookup(struct __sk_buff *skb, __u64 *cookie)
{
	if (bpf_skb_load_bytes(skb, EZ_RELEASE_COOKIE_OFF, cookie, sizeof(*cookie)))
		return NULL;
	return bpf_map_lookup_elem(&ez_sc_sockets, cookie);
}

/*
 * Uninstall, after draining is set and in-flight redirects had time to land:
 * removes the socket from ez_sc_sockets once its psock queue is empty (removing
 * one with queued bytes would discard them, sk_psock_destroy).
 */
SEC("tc")
int ez_sc_release(struct __sk_buff *skb)
{
	struct bpf_sock *sk;
	struct tcp_sock *tp;
	__u64 cookie;
	int ret = EZ_REL_WAIT;

	sk = release_lookup(skb, &cookie);
	if (!sk)
		return EZ_REL_GONE;
	tp = bpf_skc_to_tcp_sock(sk);
	if (tp && psock_empty((struct sock *)tp)) {
		ret = EZ_REL_GONE;
		if (!bpf_map_delete_elem(&ez_sc_sockets, &cookie)) {
			count(EZ_C_SOCKETS_RELEASED);
			ret = EZ_REL_RELEASED;
		}
	}
	bpf_sk_release(sk);
	return ret;
}

/*
 * Run by the agent every ~100 ms after a switch: the backstop of sockops'
 * on_segment, which needs a segment in or out. Removes an end of a switched
 * connection once nothing redirected to it is unread (may_leave). A client
 * still waiting for its outcome is left to sockops, which settles it.
 */
SEC("tc")
int ez_sc_release_switched(struct __sk_buff *skb)
{
	struct bpf_sock *sk;
	struct tcp_sock *tp;
	struct ez_unread *u;
	struct ez_sock *es;
	__u64 ukey, cookie;
	int ret = EZ_REL_KEEP;

	sk = release_lookup(skb, &cookie);
	if (!sk)
		return EZ_REL_GONE;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		goto out;
	es = bpf_sk_storage_get(&ez_sc_socks, tp, 0, 0);
	if (!es || es->state != EZ_SOCK_PAIRED)
		goto out;
	ukey = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &ukey);
	if (!u || !u->switched)
		goto out;
	if (rx_gauged(es) && u->unread[rx_dir(es) & 1] > 0)
		goto out; /* gauge mode: stays until it closes (unread.h, ez_sc_rx_socks) */
	if (may_leave(u, es, (struct sock *)tp) && !bpf_map_delete_elem(&ez_sc_sockets, &cookie)) {
		es->state = EZ_SOCK_LEFT;
		count(EZ_C_SOCKETS_RELEASED);
		ret = EZ_REL_RELEASED;
		goto out;
	}
	ret = EZ_REL_WAIT; /* still holds unread bytes: the agent passes again */
out:
	bpf_sk_release(sk);
	return ret;
}

#endif
