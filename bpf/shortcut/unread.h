/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Backpressure. bpf_tcp_ingress charges redirected bytes to the receiver
 * without ever comparing them with sk_rcvbuf, and nothing in BPF can block a
 * sender on the shortcut (no ACKs, so no write_space wake-up): a receiver
 * that stops reading would let its sender fill node TCP memory (ENOMEM).
 * So each connection counts, per direction, the bytes redirected and not
 * read yet (struct ez_unread); when one more message would pass the
 * receiver's bound the connection switches to the kernel path for good, where
 * TCP's window and the sender's sndbuf block, EAGAIN and poll as plain TCP.
 * Bytes redirected before sit in the receiver's psock queue, which
 * tcp_bpf_recvmsg reads before the TCP receive queue: no reorder. Each end
 * then leaves the sockhash once nothing redirected to it is unread (sockops
 * header-option callbacks; the agent's ez_sc_release_switched iterator as a
 * backstop), so FIONREAD (psock bytes only while enrolled) is exact again.
 * Both ends leave: psock, sk_prot and sk_msg are per socket.
 */
#ifndef EZ_SHORTCUT_UNREAD_H
#define EZ_SHORTCUT_UNREAD_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "lib/bound.h"
#include "shortcut/control.h"
#include "shortcut/select.h"

/* include/net/sock.h: sk_user_data carries three flag bits (NOCOPY 1, BPF 2,
 * PSOCK 4) and SK_USER_DATA_PTRMASK is ~7. Masking with ~3 left PSOCK set and
 * read msg_tot_len 4 bytes off (psock->state, never 0). */
#define EZ_SK_USER_DATA_PTRMASK (~7UL)

/*
 * Whether nothing is queued in a socket's psock ingress queue (true without a
 * psock). psock->msg_tot_len (what FIONREAD reports) is in Linux 6.15 and was
 * backported to 6.12.75; before it, an empty ingress_msg list is the same
 * answer (list_empty: the head points at itself).
 */
static __always_inline bool psock_empty(struct sock *sk)
{
	struct sk_psock *psock;

	psock = (struct sk_psock *)((unsigned long)BPF_CORE_READ(sk, sk_user_data) & EZ_SK_USER_DATA_PTRMASK);
	if (!psock)
		return true;
	if (bpf_core_field_exists(psock->msg_tot_len))
		return BPF_CORE_READ(psock, msg_tot_len) == 0;
	return (void *)BPF_CORE_READ(psock, ingress_msg.next) == (void *)&psock->ingress_msg;
}

static __always_inline bool rx_gauge(void)
{
	return ez_cfg_flags & EZ_CFG_RX_GAUGE;
}

/* Whether es's end keeps the gauge's rules: this load gauges, or a gauge
 * load enrolled it (it is registered below) and an upgrade to counted reads
 * came since. Its unread count then lacks the reads made before the
 * upgrade, so it must not decide RST on close or leaving the sockhash; its
 * psock still runs the gauge's sk_msg program (sock_map_link takes a
 * socket's programs at insertion, sock_map_prog_update changes only the
 * map's). */
static __always_inline bool rx_gauged(const struct ez_sock *es)
{
	return rx_gauge() || bpf_map_lookup_elem(&ez_sc_rx_socks, (void *)&es->self_cookie);
}

/* Registers an enrolled socket for the gauge (no-op when reads are counted). */
static __always_inline void rx_sock_register(struct bpf_sock *sk, __u64 cookie)
{
	struct tcp_sock *tp;
	__u64 addr;

	if (!rx_gauge())
		return;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	addr = (__u64)(unsigned long)tp;
	bpf_map_update_elem(&ez_sc_rx_socks, &cookie, &addr, BPF_ANY);
}

/* The registered socket with that cookie, for probe reads only; NULL: unknown. */
static __always_inline struct sock *rx_sock(__u64 cookie)
{
	__u64 *addr = bpf_map_lookup_elem(&ez_sc_rx_socks, &cookie);
	struct sock *sk;

	if (!addr || !*addr)
		return NULL;
	sk = (struct sock *)(unsigned long)*addr;
	if ((__u64)BPF_CORE_READ(sk, __sk_common.skc_cookie.counter) != cookie)
		return NULL;
	return sk;
}

/* The receiver's redirected, unread bytes; -1: unknown (treat as full). */
static __always_inline __s64 rx_queued(__u64 cookie)
{
	struct sock *sk = rx_sock(cookie);

	if (!sk)
		return -1;
	return BPF_CORE_READ(sk, sk_backlog.rmem_alloc.counter);
}

static __always_inline __u64 unread_key(const struct ez_sock *es)
{
	return (es->flags & EZ_F_CLIENT) ? es->self_cookie : es->peer_cookie;
}

/* The direction this end sends (0: client to server); it receives the other. */
static __always_inline __u32 tx_dir(const struct ez_sock *es)
{
	return (es->flags & EZ_F_CLIENT) ? 0 : 1;
}

static __always_inline __u32 rx_dir(const struct ez_sock *es)
{
	return tx_dir(es) ^ 1;
}

/* The bound of a socket as a receiver (lib/bound.h). */
static __always_inline __u32 tp_rx_bound(struct tcp_sock *tp)
{
	struct sock *sk = (struct sock *)tp;
	struct net *net;
	__s32 rmem_max = 0;
	__u32 userlocks;

	if (ez_cfg_max_unread)
		return ez_cfg_max_unread;
	if (!tp)
		return ez_unread_bound(0, 0, 0, 0, false);
	net = BPF_CORE_READ(sk, __sk_common.skc_net.net);
	if (net)
		rmem_max = BPF_CORE_READ(net, ipv4.sysctl_tcp_rmem[2]);
	/* sk_userlocks is a 4-bit bitfield before 6.4 (6.1: after sk_gso_disabled,
	 * sk_kern_sock, sk_no_check_tx/rx), a u8 since: a plain CO-RE read of
	 * the byte took sk_kern_sock for SOCK_RCVBUF_LOCK. */
	userlocks = BPF_CORE_READ_BITFIELD_PROBED(sk, sk_userlocks);
	return ez_unread_bound(0, userlocks, BPF_CORE_READ(sk, sk_rcvbuf), rmem_max, ez_cfg_flags & EZ_CFG_KERNEL_BP);
}

/* The bound of a socket sockops runs for. */
static __always_inline __u32 sock_rx_bound(struct bpf_sock *bsk)
{
	return tp_rx_bound(bpf_skc_to_tcp_sock(bsk));
}

/* Drops one end's reference; the last one removes the record. */
static __always_inline void unread_put(__u64 key)
{
	struct ez_unread *u = bpf_map_lookup_elem(&ez_sc_unreads, &key);

	if (u && __sync_fetch_and_add(&u->refs, -1) == 1)
		delete_record(&ez_sc_unreads, &key);
}

/*
 * Whether an end of a switched connection may leave the sockhash now:
 * nothing redirected to it is queued or on its way. Ordering: a sender adds
 * to unread[dir] before it reads `switched` (sk_msg), and we read `switched`
 * before unread[dir]; the atomics are fully ordered. So a sender that saw
 * switched == 0, and will redirect to us, has its bytes in unread before we
 * can see switched == 1: a redirect never lands in a socket that left (it
 * would get -EPIPE or be freed). Residual: two threads writing one socket
 * at the switch, where the second's kernel-path bytes are read (and
 * subtracted) before the first's redirect lands.
 */
static __always_inline bool may_leave(struct ez_unread *u, struct ez_sock *es, struct sock *sk)
{
	if (!u->switched)
		return false;
	/* Gauge mode: unread[] counts what was redirected, never what was
	 * read, so an end that received anything stays (see ez_sc_rx_socks). */
	if (u->unread[rx_dir(es) & 1] > 0)
		return false;
	return psock_empty(sk);
}

#endif
