/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Which network namespaces carry the RST on close (closereset.h) on every
 * device their packets leave by: their loopback and, with the agent's
 * --close-reset-devices=covered, their host-side veths (pods) or the node's
 * bridges (the agent's own namespace). A pod's namespace is found from its
 * processes, which netlink does not announce, so the agent also learns of
 * one here: its first handshake (BPF_SOCK_OPS_RWND_INIT, the client's
 * connect() and the server's SYN) asks for it in ez_sc_netns_wanted, and
 * the agent attaches the program and adds the namespace to
 * ez_sc_netns_covered. Without ez_covered_only a socket enrolled before
 * that is counted (EZ_R_UNCOVERED): closed with unread bytes, its FIN over
 * that loopback stays a FIN. With it, such a socket does not enrol
 * (EZ_C_FB_UNCOVERED): its connection stays on the kernel path, where the
 * kernel itself sends the RST.
 */
#ifndef EZ_SHORTCUT_COVERAGE_H
#define EZ_SHORTCUT_COVERAGE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
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

/* Whether the namespace with cookie ns is covered (the agent has filled
 * the map: before, none is). */
static __always_inline bool coverage_has(__u64 ns)
{
	return ez_netns_coverage && bpf_map_lookup_elem(&ez_sc_netns_covered, &ns);
}

/* May skops' socket enrol? With ez_covered_only only in a covered
 * namespace; one that is not is asked for and counted. */
static __always_inline bool coverage_gate(struct bpf_sock_ops *skops)
{
	if (!ez_covered_only)
		return true;
	if (ez_netns_coverage && coverage_ask(skops))
		return true;
	ez_counter_add(&ez_sc_counters, EZ_C_FB_UNCOVERED, 1);
	return false;
}

/* coverage_gate for a socket an adoption round holds. */
static __always_inline bool coverage_gate_sk(struct sock *sk)
{
	if (!ez_covered_only)
		return true;
	return coverage_has(BPF_CORE_READ(sk, __sk_common.skc_net.net, net_cookie));
}

/* At an enrolment: count the socket if its namespace is not covered yet. */
static __always_inline void coverage_count(struct bpf_sock_ops *skops)
{
	if (!coverage_ask(skops))
		ez_counter_add(&ez_sc_reset_counters, EZ_R_UNCOVERED, 1);
}

#endif
