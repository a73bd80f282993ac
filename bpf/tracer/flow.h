/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow tuple of a kernel sk_buff, parsed by lib/parse.h. */
#ifndef EZ_TRACER_FLOW_H
#define EZ_TRACER_FLOW_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "lib/parse.h"

/* Where the IP header is, relative to what each hook sees. */
enum trc_l3 {
	TRC_L3_NET,	/* skb->head + network_header (netfilter, tcx) */
	TRC_L3_DATA,	/* skb->data (RX after eth_type_trans) */
	TRC_L3_ETH,	/* skb->data + ETH_HLEN (TX at dev_queue_xmit) */
};

/*
 * trc_parse fills the flow of skb (see ez_parse; ports stay 0 behind IPv6
 * extension headers). Reads stay inside the linear data. Returns 0 for IP.
 */
static __always_inline int trc_parse(struct sk_buff *skb, enum trc_l3 where, struct ez_flow *f)
{
	unsigned char *data = BPF_CORE_READ(skb, data);
	__u32 headlen = BPF_CORE_READ(skb, len) - BPF_CORE_READ(skb, data_len);
	struct ez_pkt p = { .eth_proto = bpf_ntohs(BPF_CORE_READ(skb, protocol)) };
	unsigned char *l3;

	switch (where) {
	case TRC_L3_NET:
		l3 = BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, network_header);
		break;
	case TRC_L3_DATA:
		l3 = data;
		break;
	default:
		l3 = data + 14;
		break;
	}
	if (l3 < data || l3 > data + headlen)
		return -1;
	p.kern = l3;
	p.len = data + headlen - l3;
	return ez_parse(&p, true, f);
}

#endif
