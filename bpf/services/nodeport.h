/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * NodePort at tc ingress of the node's devices (ez_svc_nodeport): a packet
 * that starts a flow to one of the node's addresses (ez_svc_node_addrs) on a
 * NodePort gets a backend, and the flow's conntrack entry is created here
 * with the NAT (bpf_skb_ct_alloc + bpf_ct_set_nat_info + bpf_ct_insert_entry):
 * DNAT to the backend, and with externalTrafficPolicy Cluster SNAT to the
 * node address the client used, as kube-proxy's masquerade does. The packet
 * then goes on through the node's stack, where netfilter finds the entry and
 * applies the NAT to it and to every later packet both ways: the node's
 * firewall (FORWARD, NetworkPolicy) still decides, and the reply direction
 * is conntrack's. externalTrafficPolicy Local uses the node's own backends
 * and keeps the client's source. A flow conntrack knows already is left
 * alone; anything not handled exactly (no backend, no entry made, not a
 * flow's first packet) goes on unchanged to the kernel path, counted.
 */
#ifndef EZ_SERVICES_NODEPORT_H
#define EZ_SERVICES_NODEPORT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lib/parse.h"
#include "lib/ct.h"
#include "services/backend.h"

extern struct nf_conn___init *bpf_skb_ct_alloc(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					      struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern int bpf_ct_set_nat_info(struct nf_conn___init *nfct, union nf_inet_addr *addr, int port,
			       enum nf_nat_manip_type manip) __ksym;
extern void bpf_ct_set_timeout(struct nf_conn___init *nfct, __u32 timeout) __ksym;
extern struct nf_conn *bpf_ct_insert_entry(struct nf_conn___init *nfct) __ksym;

#define EZ_NP_ETH_HLEN 14
#define EZ_NP_CT_TIMEOUT_MS 60000	/* until the flow's packets refresh it (SYN_SENT's own is 120 s) */

/* a as the maps store it: 16 bytes, IPv4 v4-mapped. */
static __always_inline void np_addr16(const struct ez_flow *f, const __u32 a[4], __u8 out[16])
{
	if (f->family == 4) {
		__builtin_memset(out, 0, 10);
		out[10] = 0xff;
		out[11] = 0xff;
		__builtin_memcpy(out + 12, &a[0], 4);
	} else {
		__builtin_memcpy(out, a, 16);
	}
}

static __always_inline void np_nat_addr(const struct ez_flow *f, const __u8 a16[16], union nf_inet_addr *out)
{
	__builtin_memset(out, 0, sizeof(*out));
	if (f->family == 4)
		__builtin_memcpy(&out->ip, a16 + 12, 4);
	else
		__builtin_memcpy(out->ip6, a16, 16);
}

#endif
