/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Which network namespaces' loopbacks carry the RST on close
 * (closereset.h). A pod's namespace is found from its processes, which
 * netlink does not announce, so the agent also learns of one here: its first
 * handshake (BPF_SOCK_OPS_RWND_INIT, the client's connect() and the
 * server's SYN) asks for it in ez_sc_netns_wanted, and the agent attaches
 * the program and adds the namespace to ez_sc_netns_covered. A socket
 * enrolled before that is counted (EZ_R_UNCOVERED): closed with unread
 * bytes, its FIN over that loopback stays a FIN.
 */
#ifndef EZ_SHORTCUT_COVERAGE_H
#define EZ_SHORTCUT_COVERAGE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/counters.h"
#include "shortcut/shortcut.h"

/* Whether skops' namespace is covered; if not, it is asked for (once: an
 * entry already there keeps its first time). Always true until the agent
 * has filled ez_sc_netns_covered (ez_netns_coverage). */
static __always_inline bool coverage_ask(struct bpf_sock_ops *skops)
{
	__u64 ns, now;

	if (!ez_netns_coverage)
		return true;
	ns = bpf_get_netns_cookie(skops);
	if (bpf_map_lookup_elem(&ez_sc_netns_covered, &ns))
		return true;
	now = bpf_ktime_get_ns();
	bpf_map_update_elem(&ez_sc_netns_wanted, &ns, &now, BPF_NOEXIST);
	return false;
}

/* At an enrolment: count the socket if its namespace is not covered yet. */
static __always_inline void coverage_count(struct bpf_sock_ops *skops)
{
	if (!coverage_ask(skops))
		ez_counter_add(&ez_sc_reset_counters, EZ_R_UNCOVERED, 1);
}

#endif
