/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The bound on a receiver's redirected-but-unread bytes (shortcut/unread.h). Pure: unit-tested in bpf/test. */
#ifndef EZ_LIB_BOUND_H
#define EZ_LIB_BOUND_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* Autotuning's ceiling is capped here: tcp_rmem[2] is often 6-32 MiB. */
#define EZ_UNREAD_AUTO_MAX (4u << 20)

/* include/net/sock.h */
#define EZ_SOCK_RCVBUF_LOCK 2

/*
 * What plain TCP would let the receiver hold: the application's SO_RCVBUF
 * (sk_rcvbuf, already doubled by the kernel) when it locked it, else the
 * ceiling autotuning may grow sk_rcvbuf to, min(tcp_rmem[2] of the
 * receiver's netns, EZ_UNREAD_AUTO_MAX). A non-zero override (--max-unread) wins.
 * With the kernel's backpressure (kernel_bp: kernel/patches) the kernel
 * holds the writer at the receiver's sk_rcvbuf and grows that as
 * autotuning does, up to tcp_rmem[2]: that ceiling is not capped, since a
 * lower bound would switch connections the kernel holds within what plain
 * TCP allows.
 */
static __always_inline __u32 ez_unread_bound(__u32 override, __u32 userlocks, __s32 rcvbuf, __s32 rmem_max,
					     bool kernel_bp)
{
	if (override)
		return override;
	if ((userlocks & EZ_SOCK_RCVBUF_LOCK) && rcvbuf > 0)
		return rcvbuf;
	if (kernel_bp && !(userlocks & EZ_SOCK_RCVBUF_LOCK) && rmem_max > 0)
		return rmem_max;
	if (rmem_max > 0 && (__u32)rmem_max < EZ_UNREAD_AUTO_MAX)
		return rmem_max;
	return EZ_UNREAD_AUTO_MAX;
}

#endif
