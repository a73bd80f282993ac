/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The kernel-side filter of the tracer (struct ez_trc_config). */
#ifndef EZ_TRACER_FILTER_H
#define EZ_TRACER_FILTER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/parse.h"

static __always_inline bool trc_addr_eq(const __u32 *a, __u8 family)
{
	if (family == 4)
		return a[0] == ez_trc_cfg.host[0];
	return a[0] == ez_trc_cfg.host[0] && a[1] == ez_trc_cfg.host[1] &&
	       a[2] == ez_trc_cfg.host[2] && a[3] == ez_trc_cfg.host[3];
}

/* The filter: every configured field must match. */
static __always_inline bool trc_match(const struct ez_flow *r, __u32 ifindex, __u64 netns)
{
	if (ez_trc_cfg.family && r->family != ez_trc_cfg.family)
		return false;
	if (ez_trc_cfg.proto && r->proto != ez_trc_cfg.proto)
		return false;
	if (ez_trc_cfg.port && r->sport != ez_trc_cfg.port && r->dport != ez_trc_cfg.port)
		return false;
	if (ez_trc_cfg.sport && r->sport != ez_trc_cfg.sport)
		return false;
	if (ez_trc_cfg.dport && r->dport != ez_trc_cfg.dport)
		return false;
	if (ez_trc_cfg.host_set && !trc_addr_eq(r->saddr, r->family) && !trc_addr_eq(r->daddr, r->family))
		return false;
	if (ez_trc_cfg.ifindex && ifindex != ez_trc_cfg.ifindex)
		return false;
	if (ez_trc_cfg.netns && netns != ez_trc_cfg.netns)
		return false;
	return true;
}

#endif
