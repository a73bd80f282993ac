/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Scope: in Kubernetes mode the cgroup hooks are attached once, at the pods'
 * root cgroup, and a socket may enrol only when its cgroup or one of its
 * closest ancestors is in ez_sc_cgroups (the agent puts pod-level cgroups
 * there; containers are their children). Selecting a pod is a map update,
 * and deselecting one leaves its established connections on their path with
 * every callback they need (a detached link would drop STATE_CB, and with it
 * the unread record's release at close).
 *
 * Quirk: sock_ops has no bpf_sk_cgroup_id; the cgroup is read through the
 * BTF pointer bpf_skc_to_tcp_sock returns (sk_cgrp_data.cgroup, the socket's
 * cgroup v2 cgroup, fixed at socket creation and inherited by accepted
 * sockets from their listener).
 */
#ifndef EZ_SHORTCUT_SCOPE_H
#define EZ_SHORTCUT_SCOPE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "shortcut/control.h"
#include "shortcut/select.h"

/* Levels looked at: the socket's cgroup and its parents (container, pod, and
 * two more for runtimes that nest a level). */
#define EZ_SCOPE_DEPTH 4

/* The value map holds for tp's cgroup or its closest ancestor within depth
 * levels, NULL when none has one. */
static __always_inline void *cgroup_lookup(struct tcp_sock *tp, void *map, int depth)
{
	struct cgroup *cg;

	if (!tp)
		return NULL;
	cg = BPF_CORE_READ(tp, inet_conn.icsk_inet.sk.sk_cgrp_data.cgroup);
	for (int i = 0; i < depth && cg; i++) {
		__u64 id = BPF_CORE_READ(cg, kn, id);
		void *e = bpf_map_lookup_elem(map, &id);

		if (e)
			return e;
		cg = (struct cgroup *)BPF_CORE_READ(cg, self.parent);
	}
	return NULL;
}

/* The ez_sc_cgroups entry that selects tp's cgroup, NULL when none does. */
static __always_inline struct ez_cgroup *scope_entry_tp(struct tcp_sock *tp)
{
	return cgroup_lookup(tp, &ez_sc_cgroups, EZ_SCOPE_DEPTH);
}

static __always_inline struct ez_cgroup *scope_entry(struct bpf_sock *sk)
{
	return scope_entry_tp(bpf_skc_to_tcp_sock(sk));
}

/* May sk enrol? Always without the cgroup filter; *entry is the selecting
 * ez_sc_cgroups entry (scope_count counts the enrolment there). */
static __always_inline bool scope_selected(struct bpf_sock *sk, struct ez_cgroup **entry)
{
	*entry = NULL;
	if (!(ez_cfg_flags & EZ_CFG_CGROUP_FILTER))
		return true;
	*entry = scope_entry(sk);
	return *entry != NULL;
}

/* scope_selected for a socket an iterator holds. */
static __always_inline bool scope_selected_tp(struct tcp_sock *tp, struct ez_cgroup **entry)
{
	*entry = NULL;
	if (!(ez_cfg_flags & EZ_CFG_CGROUP_FILTER))
		return true;
	*entry = scope_entry_tp(tp);
	return *entry != NULL;
}

static __always_inline void scope_count(struct ez_cgroup *e)
{
	if (e)
		__sync_fetch_and_add(&e->enrolled, 1);
}

#endif
