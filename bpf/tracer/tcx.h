/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* tcx observers, attached first and last on chosen interfaces. They only
 * look: every one returns TCX_NEXT so the chain behaves as without them. */
#ifndef EZ_TRACER_TCX_H
#define EZ_TRACER_TCX_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "tracer/track.h"

/* tc programs get a __sk_buff; the sk_buff address (the packet's identity)
 * comes from this kfunc (6.3+). */
extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

static __always_inline int trc_tcx(struct __sk_buff *ctx, __u32 kind)
{
	trc_dev(bpf_cast_to_kern_ctx(ctx), kind, TRC_L3_NET, true);
	return TCX_NEXT;
}

#endif
