/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Tracepoints. Each is built twice from one body: tp_btf (preferred) and
 * raw_tp (used when attaching tp_btf fails). Both see the arguments as an
 * array of u64; the body's btf flag says whether they are BTF pointers that
 * may be read with direct loads (tp_btf) or only through
 * bpf_probe_read_kernel (raw_tp), which costs a helper call per read.
 */
#ifndef EZ_TRACER_TP_H
#define EZ_TRACER_TP_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "tracer/track.h"

static __always_inline void trc_rx(__u64 *a, bool btf) { trc_dev((void *)a[0], TRC_K_RX, TRC_L3_DATA, btf); }
static __always_inline void trc_recv(__u64 *a, bool btf)
{
	__u32 zero = 0;
	__u64 *last = bpf_map_lookup_elem(&trc_last_rx, &zero);

	if (last)
		*last = a[0];
	trc_dev((void *)a[0], TRC_K_RECV, TRC_L3_DATA, btf);
}
static __always_inline void trc_queue(__u64 *a, bool btf) { trc_dev((void *)a[0], TRC_K_QUEUE, TRC_L3_ETH, btf); }
static __always_inline void trc_xmit(__u64 *a, bool btf) { trc_dev((void *)a[0], TRC_K_XMIT, TRC_L3_ETH, btf); }
static __always_inline void trc_done(__u64 *a, bool btf) { trc_dev((void *)a[0], TRC_K_DONE, TRC_L3_ETH, btf); }

static __always_inline void trc_copy(__u64 *a, bool btf)
{
	trc_track((void *)a[0], EZ_TRC_COPY, TRC_L3_NET, 0, 0);
}

static __always_inline void trc_consume(__u64 *a, bool btf) { trc_free((void *)a[0], 0); }

/* kfree_skb(skb, location, reason, rx_sk): SKB_CONSUMED comes through here on
 * kernels that route consume through kfree_skb; it is not a drop. */
static __always_inline void trc_kfree(__u64 *a, bool btf)
{
	__u32 reason = a[2];

	trc_free((void *)a[0], reason == SKB_CONSUMED ? 0 : reason);
}

#endif
