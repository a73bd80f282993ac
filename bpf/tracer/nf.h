/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Netfilter timing. For each table priority P in use at a hook, Go attaches
 * trc_nf_<table>_before at P-1 and trc_nf_<table>_after at P+1; the time
 * between them is the table's. The first "before" at a hook is the hook's
 * stage timestamp. Quirk: the kernel refuses (EBUSY) two BPF programs at one
 * hook and priority, so Go moves outward to the next free priority.
 */
#ifndef EZ_TRACER_NF_H
#define EZ_TRACER_NF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "tracer/tracer.h"
#include "tracer/track.h"

#define TRC_NF_ACCEPT 1

static __always_inline void trc_nf(struct bpf_nf_ctx *ctx, __u32 table, bool before)
{
	const struct nf_hook_state *st = ctx->state;
	struct sk_buff *skb = ctx->skb;
	struct net_device *dev;
	struct ez_trc_pkt *r;
	__u64 netns, key, now;
	__u32 hook, slot, side;
	enum trc_side where;

	hook = BPF_CORE_READ(st, hook);
	if (hook >= EZ_TRC_HOOKS)
		return;
	netns = BPF_CORE_READ(st, net, net_cookie);
	where = trc_side(netns);
	if (where == TRC_SIDE_WIRE)
		return;
	if (before) {
		dev = BPF_CORE_READ(st, in);
		if (!dev)
			dev = BPF_CORE_READ(st, out);
		r = trc_track(skb, trc_stage(hook, where == TRC_SIDE_HOST), TRC_L3_NET, netns,
			      dev ? BPF_CORE_READ(dev, ifindex) : 0);
		if (r)
			r->nf_start = bpf_ktime_get_ns();
		return;
	}
	key = (__u64)skb;
	r = bpf_map_lookup_elem(&trc_pkts, &key);
	if (!r || !r->nf_start)
		return;
	side = where != TRC_SIDE_HOST ? 0 : (r->host1 && r->host1 != netns) ? 2 : 1;
	slot = (side * EZ_TRC_HOOKS + hook) * EZ_TRC_TABLES + table;
	now = bpf_ktime_get_ns();
	if (slot < EZ_TRC_NF_SLOTS)
		r->nf_ns[slot] += now - r->nf_start;
	r->nf_start = 0;
	r->last_ns = now; /* the lifetime's end is at least here */
}

#endif
