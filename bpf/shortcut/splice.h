/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Readers that splice. A redirect (bpf_msg_redirect_hash, BPF_F_INGRESS)
 * queues bytes on the receiver's psock->ingress_msg, which only
 * tcp_bpf_recvmsg reads (sk_prot->recvmsg). splice(2) and sendfile(2) from a
 * TCP socket run inet_stream_ops.splice_read = tcp_splice_read ->
 * tcp_read_sock, which reads sk_receive_queue only (net/ipv4/tcp.c): a
 * redirected byte is invisible to them, and tcp_splice_read returns 0 at
 * RCV_SHUTDOWN, which Go's io.Copy (internal/poll.Splice) takes for EOF.
 * Nothing moves bytes from a psock back to sk_receive_queue, and dropping
 * the psock purges them (sk_psock_drop -> sk_psock_destroy).
 *
 * So a direction redirects only into a socket that has shown it reads with
 * recvmsg (ez_sc_rx, written by the read counter, shortcut/recv.h); until
 * then its sender's messages take the kernel path (counted rx_gated). The
 * move from the kernel path to the shortcut is exact by sequence numbers:
 * a redirected byte never advances the sender's write_seq (tcp_bpf_sendmsg
 * redirects before tcp_sendmsg_locked) nor the receiver's copied_seq
 * (sk_msg_recvmsg), so the sender's write_seq equal to the copied_seq the
 * receiver's last recvmsg left (it only grows; a stale value is smaller)
 * proves every kernel-path byte was read: the redirected bytes that follow
 * overtake none. Each end sends under its socket lock, so no kernel-path
 * byte of its own can follow the check. The direction then redirects for
 * good (EZ_F_TX_OPEN) unless the connection switches (unread.h).
 *
 * A splice of a socket that reads with recvmsg switches its connection to
 * the kernel path before tcp_splice_read reads: at its entry (fentry) where
 * the host allows fentry, else at the syscall's entry (syscalls:
 * sys_enter_splice and sys_enter_sendfile64 where tracefs is reachable, else
 * the raw tracepoint sys_enter); bytes redirected
 * before are stranded in its psock until a recvmsg: counted
 * splice_stranded. The process is then remembered (ez_sc_splicers): its
 * sockets never count as readers again, so only its first splice after a
 * recvmsg can strand. Neither sees IORING_OP_SPLICE (io_uring).
 */
#ifndef EZ_SHORTCUT_SPLICE_H
#define EZ_SHORTCUT_SPLICE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "shortcut/control.h"
#include "shortcut/unread.h"

#define EZ_S_IFMT 00170000
#define EZ_S_IFSOCK 0140000
#define EZ_SOCK_STREAM 1
#define EZ_SK_USER_DATA_PSOCK_TAG 4UL /* include/net/sock.h: SK_USER_DATA_PSOCK */

static __always_inline __u64 leader_start(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();

	return BPF_CORE_READ(task, group_leader, start_time);
}

/* Whether the current process spliced from a TCP socket before. */
static __always_inline bool current_splices(void)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 *start = bpf_map_lookup_elem(&ez_sc_splicers, &tgid);

	return start && *start == leader_start();
}

/*
 * Advances r's copied_seq to now, monotonic under concurrent readers (a
 * few compare-and-swap attempts), and returns by how much: the bytes read
 * from sk_receive_queue (by recvmsg, splice or read_sock) since the last
 * advance. Each advance is returned to exactly one caller.
 */
static __always_inline __u32 rx_advance(struct ez_rx *r, __u32 now)
{
	for (int i = 0; i < 4; i++) {
		__u32 old = r->copied_seq;

		if ((__s32)(now - old) <= 0)
			return 0;
		if (__sync_val_compare_and_swap(&r->copied_seq, old, now) == old)
			return now - old;
	}
	return 0;
}

/*
 * A paired socket returned from tcp_bpf_recvmsg with data (the read
 * counter, recv.h): it reads with recvmsg, and copied_seq tells its peer
 * how far it read. Not at EAGAIN: a program that reads a few bytes and
 * then splices (read-then-splice) would get redirected bytes between its
 * first read and its splice. A socket of a process that splices stays a splicer.
 * Returns the bytes of this read (or of reads since the last one) that came
 * from sk_receive_queue, not from the psock: a redirected byte never
 * advances copied_seq. Only the counting hook (owner) advances it.
 */
static __always_inline __u32 rx_note_read(struct sock *sk, struct ez_sock *es, bool owner)
{
	__u64 cookie = es->self_cookie;
	struct ez_rx *r = bpf_map_lookup_elem(&ez_sc_rx, &cookie);
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	struct ez_rx nr = {};
	__u32 now;

	/* A plain load through the BTF pointer (one cheap helper call) where
	 * a probe read cost a bpf_probe_read_kernel call per read. */
	if (tp)
		now = tp->copied_seq;
	else
		now = BPF_CORE_READ((struct tcp_sock *)sk, copied_seq);

	if (!r) {
		/* Until now no direction was open into this socket (no reader,
		 * no redirect): everything it read came through the kernel. */
		nr.unread_key = unread_key(es);
		nr.copied_seq = now;
		nr.flags = current_splices() ? EZ_RX_SPLICER : EZ_RX_READER;
		if (rx_dir(es))
			nr.flags |= EZ_RX_DIR1;
		bpf_map_update_elem(&ez_sc_rx, &cookie, &nr, BPF_NOEXIST);
		return 0xffffffff;
	}
	if (!(r->flags & (EZ_RX_READER | EZ_RX_SPLICER)))
		__sync_fetch_and_or(&r->flags, current_splices() ? EZ_RX_SPLICER : EZ_RX_READER);
	return owner ? rx_advance(r, now) : 0;
}

/*
 * Whether es's direction may redirect now (sk_msg, under the sender's
 * socket lock, paired and not switched). Gauge mode (no read counter, so
 * no reader is ever seen): every receiver counts as a reader until it
 * splices; its bytes redirected before are stranded (docs).
 */
static __always_inline bool tx_open(struct ez_sock *es, struct bpf_sock *sk, struct ez_unread *u)
{
	struct tcp_sock *tp;
	struct ez_rx *r;

	if (es->flags & EZ_F_TX_OPEN)
		return true;
	r = bpf_map_lookup_elem(&ez_sc_rx, &es->peer_cookie);
	if (r && (r->flags & EZ_RX_SPLICER)) {
		/* The splice switched it (rx_spliced) unless the receiver's
		 * key was unknown there; a gone connection switches here. */
		if (__sync_val_compare_and_swap(&u->switched, 0, 1) == 0)
			count(EZ_C_FB_SPLICE);
		return false;
	}
	if (rx_gauge())
		return true;
	/* Redirected before this program ran for it (an upgrade in place,
	 * which keeps each socket's program until it leaves; defensive): no
	 * sequence proof, so EZ_F_TX_OPEN stays clear (skmsg.h). */
	if (es->tx_msgs && !(es->flags & EZ_F_TX_REGATED))
		return true;
	if (!r || !(r->flags & EZ_RX_READER)) {
		count(EZ_C_RX_GATED);
		return false;
	}
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp || tp->write_seq != r->copied_seq) {
		count(EZ_C_RX_GATED);
		return false;
	}
	__sync_fetch_and_or(&es->flags, EZ_F_TX_OPEN);
	count(EZ_C_RX_OPENED);
	return true;
}

/* Whether es's direction still takes the kernel path until its receiver
 * reads (tx_open has not opened it). */
static __always_inline bool tx_gated(const struct ez_sock *es)
{
	return !rx_gauge() && !(es->flags & EZ_F_TX_OPEN) && (!es->tx_msgs || (es->flags & EZ_F_TX_REGATED));
}

/* The socket of fd in the current task, if it is a TCP stream socket. */
static __always_inline struct sock *fd_tcp_sock(long fd)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	struct file **fds, *file = NULL;
	struct socket *sock;
	struct sock *sk;

	if (!fdt || fd < 0 || fd >= BPF_CORE_READ(fdt, max_fds))
		return NULL;
	fds = BPF_CORE_READ(fdt, fd);
	if (!fds || bpf_probe_read_kernel(&file, sizeof(file), &fds[fd]) || !file)
		return NULL;
	/* sock_from_file checks f_op == &socket_file_ops; here: a socket
	 * inode whose struct socket points back at this file (an O_PATH
	 * file of a socket inode has no private_data). */
	if ((BPF_CORE_READ(file, f_inode, i_mode) & EZ_S_IFMT) != EZ_S_IFSOCK)
		return NULL;
	sock = BPF_CORE_READ(file, private_data);
	if (!sock || BPF_CORE_READ(sock, file) != file)
		return NULL;
	sk = BPF_CORE_READ(sock, sk);
	if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP || BPF_CORE_READ(sk, sk_type) != EZ_SOCK_STREAM)
		return NULL;
	return sk;
}

/* A process is about to splice from (or sendfile) the TCP socket sk. */
static __always_inline void rx_spliced_sk(struct sock *sk)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 start, cookie;
	struct ez_unread *u;
	struct ez_rx *r;
	bool stranded;

	if (!sk)
		return;
	start = leader_start();
	bpf_map_update_elem(&ez_sc_splicers, &tgid, &start, BPF_ANY);
	/* Only a socket with a psock (sk_user_data tagged) can hold
	 * redirected bytes; our enrolled sockets have a cookie. */
	if (!((unsigned long)BPF_CORE_READ(sk, sk_user_data) & EZ_SK_USER_DATA_PSOCK_TAG))
		return;
	cookie = BPF_CORE_READ(sk, __sk_common.skc_cookie.counter);
	if (!cookie)
		return;
	r = bpf_map_lookup_elem(&ez_sc_rx, &cookie);
	if (!r) {
		struct ez_rx nr = { .flags = EZ_RX_SPLICER };

		nr.copied_seq = BPF_CORE_READ((struct tcp_sock *)sk, copied_seq);

		/* Never a reader: its peer never redirected to it (or did
		 * before this program: then its psock tells). */
		bpf_map_update_elem(&ez_sc_rx, &cookie, &nr, BPF_NOEXIST);
		if (!psock_empty(sk))
			count(EZ_C_SPLICE_STRANDED);
		return;
	}
	if (__sync_fetch_and_or(&r->flags, EZ_RX_SPLICER) & EZ_RX_SPLICER)
		return;
	stranded = !psock_empty(sk);
	u = r->unread_key ? bpf_map_lookup_elem(&ez_sc_unreads, &r->unread_key) : NULL;
	if (u) {
		/* As the backpressure switch (skmsg.h): the sender adds to
		 * unread, then reads switched; we set switched, then read
		 * unread. A redirect that raced us is counted either way. */
		if (__sync_val_compare_and_swap(&u->switched, 0, 1) == 0)
			count(EZ_C_FB_SPLICE);
		if (!rx_gauge() && u->unread[(r->flags & EZ_RX_DIR1) ? 1 : 0] > 0)
			stranded = true;
	}
	if (stranded)
		count(EZ_C_SPLICE_STRANDED);
}

/* A process is about to splice from (or sendfile) fd. */
static __always_inline void rx_spliced(long fd)
{
	struct sock *sk = fd_tcp_sock(fd);

	if (sk)
		rx_spliced_sk(sk);
}

/* A syscall's saved user registers, per architecture (CO-RE picks the one
 * the kernel has; the other's relocation is poisoned, never run). */
struct pt_regs___x86 {
	unsigned long di;
	unsigned long si;
} __attribute__((preserve_access_index));

struct pt_regs___arm64 {
	__u64 regs[31];
} __attribute__((preserve_access_index));

static __always_inline long syscall_arg(void *regs, int n)
{
	if (bpf_core_field_exists(((struct pt_regs___x86 *)0)->di))
		return n ? BPF_CORE_READ((struct pt_regs___x86 *)regs, si) : BPF_CORE_READ((struct pt_regs___x86 *)regs, di);
	return n ? BPF_CORE_READ((struct pt_regs___arm64 *)regs, regs[1]) : BPF_CORE_READ((struct pt_regs___arm64 *)regs, regs[0]);
}

#endif
