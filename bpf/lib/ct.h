/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Conntrack kfuncs (net/netfilter/nf_conntrack_bpf.c; tc and XDP programs
 * only) and the lookup tuple of a parsed flow, shared by the bridge bypass
 * and the NodePort program.
 */
#ifndef EZ_LIB_CT_H
#define EZ_LIB_CT_H

#include "lib/parse.h"

/*
 * The bpf_ct_opts size passed to every kfunc: 12, the size before ct_zone_id
 * (nf_conntrack_bpf.c: Linux 6.1 takes only 12; kernels with ct_zone_id,
 * 6.12 among them, take 12 or 16 and read the zone only from 16). eztunnel
 * looks up zone 0, so 12 everywhere.
 */
#define EZ_CT_OPTS_SZ 12

/*
 * A program that must also load where nf_conntrack is not (the shortcut's
 * close reset) defines EZ_CT_WEAK before including this file: the kfuncs are
 * then weak (NULL there) and it tests them before a call. Otherwise a
 * program that calls one does not load without them. Quirk: a weak
 * redeclaration after a strong one does not make the symbol weak (clang
 * emits it GLOBAL), hence the switch rather than a second declaration.
 */
#ifdef EZ_CT_WEAK
#define EZ_CT_KFUNC __ksym __weak
#else
#define EZ_CT_KFUNC __ksym
#endif

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) EZ_CT_KFUNC;
extern void bpf_ct_release(struct nf_conn *ct) EZ_CT_KFUNC;
extern int bpf_ct_change_timeout(struct nf_conn *ct, __u32 timeout_ms) EZ_CT_KFUNC;

/* The conntrack tuple of f as its packet has it; returns its size. */
static __always_inline __u32 ez_ct_tuple(const struct ez_flow *f, struct bpf_sock_tuple *tuple)
{
	if (f->family == 4) {
		tuple->ipv4.saddr = f->saddr[0];
		tuple->ipv4.daddr = f->daddr[0];
		tuple->ipv4.sport = bpf_htons(f->sport);
		tuple->ipv4.dport = bpf_htons(f->dport);
		return sizeof(tuple->ipv4);
	}
	__builtin_memcpy(tuple->ipv6.saddr, f->saddr, 16);
	__builtin_memcpy(tuple->ipv6.daddr, f->daddr, 16);
	tuple->ipv6.sport = bpf_htons(f->sport);
	tuple->ipv6.dport = bpf_htons(f->dport);
	return sizeof(tuple->ipv6);
}

#endif
