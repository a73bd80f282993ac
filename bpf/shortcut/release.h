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
#include "shortcut/control.h"
#include "shortcut/unread.h"

/* The socket whose cookie the input packet carries, referenced (release it). */
static __always_inline struct bpf_sock *release_lookup(struct __sk_buff *skb, __u64 *cookie)
{
	if (bpf_skb_load_bytes(skb, EZ_RELEASE_COOKIE_OFF, cookie, sizeof(*cookie)))
		return NULL;
	return bpf_map_lookup_elem(&ez_sc_sockets, cookie);
}

#endif
