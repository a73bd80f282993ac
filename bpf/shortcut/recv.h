/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tp_btf/sock_recv_length: fires in sock_recvmsg_nosec after every recvmsg
 * (read, recv, recvmsg, recvmmsg, io_uring, kernel_recvmsg), so after every
 * tcp_bpf_recvmsg read of an enrolled socket. Subtracts what the receiver
 * consumed from its direction's unread count (shortcut/unread.h). splice and
 * read_sock do not fire it but never read the psock either. The kernel does
 * not filter MSG_PEEK. Runs for every recvmsg on the node: cheap exits first.
 */
#ifndef EZ_SHORTCUT_RECV_H
#define EZ_SHORTCUT_RECV_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "shortcut/maps.h"
#include "shortcut/unread.h"
#include "shortcut/adopt.h"

#define EZ_MSG_PEEK 2
#define EZ_SK_USER_DATA_PSOCK 4UL /* include/net/sock.h */

/* Only one attached ez_sc_recv counts: during an upgrade the new one is
 * attached next to the old (tracing links cannot be updated in place), and
 * the agent moves EZ_CTL_RECV_OWNER to the new one before detaching the old. */
static __always_inline bool recv_owner(void)
{
	__u32 k = EZ_CTL_RECV_OWNER;
	__u32 *v = bpf_map_lookup_elem(&ez_sc_control, &k);

	return v && *v == ez_cfg_instance;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(ez_sc_recv, struct sock *sk, int ret, int flags)
{
	struct ez_unread *u;
	struct ez_sock *es;
	__u64 key;

	if (ret <= 0 || (flags & EZ_MSG_PEEK) || !sk || sk->sk_protocol != IPPROTO_TCP)
		return 0;
	/* Only a socket in the sockhash reads redirected bytes, and every
	 * socket in a sockmap or sockhash has a psock: sk_user_data tagged
	 * SK_USER_DATA_PSOCK. The states counted below are set around the
	 * insertion (WAITING, PAIRED before it, undone if it fails; ADOPT_IN
	 * after it). Every other socket returns here, before the storage
	 * lookup, which costs more than the rest of the program. */
	if (!((unsigned long)sk->sk_user_data & EZ_SK_USER_DATA_PSOCK))
		return 0;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (!es)
		return 0;
	if (es->state == EZ_SOCK_ADOPT_IN)
		adopt_settle(es); /* its peer may have redirected since activation */
	if (es->state != EZ_SOCK_PAIRED && es->state != EZ_SOCK_WAITING)
		return 0;
	if (!recv_owner())
		return 0;
	key = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &key);
	if (u)
		__sync_fetch_and_add(&u->unread[rx_dir(es) & 1], -(__s64)ret);
	return 0;
}

#endif
