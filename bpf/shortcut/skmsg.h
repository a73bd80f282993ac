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
#include "shortcut/control.h"
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
 * sk_stream_wait_memory). So near pressure the direction goes back to the
 * kernel path, whose window and memory waits hold the writer. Bytes already
 * redirected are in the receiver's psock, which tcp_bpf_recvmsg reads
 * before sk_receive_queue: nothing is overtaken. Out of gauge mode the
 * direction opens again by tx_open's sequence proof (the receiver read every
 * kernel-path byte), and the pressure is checked again at each message.
 * In gauge mode (no proof) the connection switches for good, as
 * backpressure does.
 *
 * The flag alone is not enough: __sk_mem_raise_allocated sets it in the very
 * charge that crosses tcp_mem[1], and that charge then fails the fair-share
 * test for a receiver holding more than tcp_mem[2] / sockets pages, so the
 * first redirect past the line failed with the flag still clear (the
 * sender's EOF at 8 MiB in TestTCPMemoryPressure, 2 of 6 runs under load).
 * So the redirect is predicted too: what this charge would bring the
 * global count (prot->memory_allocated) to, plus what the per-CPU caches
 * may still drain into it (sk_memory_allocated_add: each CPU holds less than
 * mem_pcpu_rsv pages; ez_cfg_mem_slack = possible CPUs x that, set by the
 * agent), must stay below tcp_mem[1] (and the flag must be clear), or
 * below tcp_mem[0], where the charge succeeds whatever the flag says.
 * Pages are counted as 4 KiB: on larger pages the estimate only errs
 * toward the kernel path.
 * Not seen: a memory cgroup's socket pressure (cgroup v2 charges socket
 * memory to the receiver's memcg), nor other sockets charging more than the
 * slack between this check and the charge.
 */
static __always_inline bool tx_mem_pressure(struct bpf_sock *bsk, struct ez_sock *es, struct ez_unread *u, __u32 size)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(bsk);
	struct proto *prot;
	unsigned long *mp, v = 0;
	long *limits, lim[2] = {}, est;
	atomic_long_t *ma;

	if (!tp)
		return false;
	/* Per message, so plain loads through the BTF pointer bpf_skc_to_tcp_sock
	 * returns (exception-table loads: a fault reads 0, as a failed probe
	 * read gave), not a bpf_probe_read_kernel call per field: the same
	 * kernel words as before. memory_pressure and sysctl_mem point at
	 * scalars, and a BTF walk turns such a pointer into a plain number:
	 * those two words still need a probe read. */
	prot = tp->inet_conn.icsk_inet.sk.__sk_common.skc_prot;
	if (!prot)
		return false;
	mp = prot->memory_pressure;
	ma = prot->memory_allocated;
	limits = prot->sysctl_mem;
	if (!mp || !ma || !limits)
		return false; /* a protocol without accounting: no charge fails */
	est = ma->counter + (long)ez_cfg_mem_slack + (long)(size >> 12) + 1;
	/* tcp_mem[0] and [1] in one probe read. A charge that leaves the count
	 * at most tcp_mem[0] succeeds whatever the flag says
	 * (__sk_mem_raise_allocated's "Under limit" test comes first, 6.1 to
	 * 6.18), so below both lines the flag is not read: the steady state
	 * costs one probe read, not two. */
	if (bpf_probe_read_kernel(lim, sizeof(lim), limits))
		return false;
	if (est < lim[0] && est < lim[1])
		return false;
	if (bpf_probe_read_kernel(&v, sizeof(v), mp))
		return false;
	if (!v && est < lim[1])
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

#endif
