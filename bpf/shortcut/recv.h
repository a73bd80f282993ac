/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Read accounting: subtracts what a receiver consumed from its direction's
 * unread count (shortcut/unread.h). Two hooks, one body (recv_count):
 *  - fexit/tcp_bpf_recvmsg (ez_sc_recv_fx), preferred: tcp_bpf_recvmsg is
 *    sk_prot->recvmsg only of a TCP socket with a psock (tcp_bpf_update_proto,
 *    TCP_BPF_BASE: we attach no stream parser, so never the _parser
 *    variant), so no other socket's read runs it. It returns what recvmsg
 *    returns, including its tcp_recvmsg fallbacks (receive queue first, no
 *    psock yet), as the tracepoint saw.
 *  - tp_btf/sock_recv_length (ez_sc_recv, Linux 6.3+), where fexit is
 *    refused (hardened hosts refuse tracing programs; some refuse them to
 *    any process but PID 1): fires in sock_recvmsg_nosec after every recvmsg
 *    on the node (read, recv, recvmsg, recvmmsg, io_uring, kernel_recvmsg),
 *    so cheap exits first. On this path the hook's dispatch costs three to
 *    four times the program (docs/benchmarks.md, "Idle wake-ups").
 * splice and read_sock run neither but never read the psock either. The
 * kernel does not filter MSG_PEEK; MSG_ERRQUEUE returns error-queue bytes
 * (inet_recv_error), not data.
 */
#ifndef EZ_SHORTCUT_RECV_H
#define EZ_SHORTCUT_RECV_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include "shortcut/control.h"
#include "shortcut/unread.h"
#include "shortcut/adopt.h"
#include "shortcut/splice.h"

#define EZ_MSG_PEEK 2
#define EZ_MSG_ERRQUEUE 0x2000
#define EZ_SK_USER_DATA_PSOCK 4UL /* include/net/sock.h */

/* Only one attached read counter (ez_sc_recv_fx or ez_sc_recv) counts:
 * during an upgrade the new one is attached next to the old (tracing links
 * cannot be updated in place), and the agent moves EZ_CTL_RECV_OWNER to the
 * new one before detaching the old. */
static __always_inline bool recv_owner(void)
{
	__u32 k = EZ_CTL_RECV_OWNER;
	__u32 *v = bpf_map_lookup_elem(&ez_sc_control, &k);

	return v && *v == ez_cfg_instance;
}

/* Counts one read of sk: ret bytes, or an error or peek (nothing). A read
 * that returned data also marks sk a recvmsg reader (splice.h). */
static __always_inline void recv_count(struct sock *sk, int ret, int flags)
{
	struct ez_unread *u;
	struct ez_sock *es;
	bool counts, owner;
	__u32 kbytes;
	__u64 key;

	if (ret <= 0 || (flags & EZ_MSG_ERRQUEUE) || !sk || sk->sk_protocol != IPPROTO_TCP)
		return;
	counts = !(flags & EZ_MSG_PEEK);
	/* Only a socket in the sockhash reads redirected bytes, and every
	 * socket in a sockmap or sockhash has a psock: sk_user_data tagged
	 * SK_USER_DATA_PSOCK. The states counted below are set around the
	 * insertion (WAITING, PAIRED before it, undone if it fails; ADOPT_IN
	 * after it). Every other socket returns here, before the storage
	 * lookup, which costs more than the rest of the program. */
	if (!((unsigned long)sk->sk_user_data & EZ_SK_USER_DATA_PSOCK))
		return;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (!es)
		return;
	if (es->state == EZ_SOCK_ADOPT_IN)
		adopt_settle(es); /* its peer may have redirected since activation */
	if (es->state != EZ_SOCK_PAIRED && es->state != EZ_SOCK_WAITING)
		return;
	owner = recv_owner();
	/* Only psock bytes were counted in: a direction takes the kernel path
	 * until its receiver reads (splice.h), so reads of receive-queue bytes
	 * (copied_seq's advance) are not subtracted. */
	kbytes = rx_note_read(sk, es, owner);
	if (!counts || !owner || kbytes >= (__u32)ret)
		return;
	key = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &key);
	if (u)
		__sync_fetch_and_add(&u->unread[rx_dir(es) & 1], -(__s64)(ret - kbytes));
}

#endif
