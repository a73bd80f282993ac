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
#include "services/maps.h"

extern struct nf_conn___init *bpf_skb_ct_alloc(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					      struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern int bpf_ct_set_nat_info(struct nf_conn___init *nfct, union nf_inet_addr *addr, int port,
			       enum nf_nat_manip_type manip) __ksym;
extern void bpf_ct_set_timeout(struct nf_conn___init *nfct, __u32 timeout) __ksym;
extern struct nf_conn *bpf_ct_insert_entry(struct nf_conn___init *nfct) __ksym;

const enum ez_svc_np_flag ez_svc_np_flag_enum __attribute__((unused));

#define EZ_NP_ETH_HLEN 14
#define EZ_NP_CT_TIMEOUT_MS 60000	/* until the flow's packets refresh it (SYN_SENT's own is 120 s) */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, struct ez_svc_np_key);
	__type(value, struct ez_svc_np);
} ez_svc_nodeports SEC(".maps");

/* The node's addresses NodePorts answer on (IPv4 v4-mapped), written by
 * userspace from the NodePort devices' addresses. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 256);
	__type(key, struct ez_svc_backend);	/* addr, port 0 */
	__type(value, __u32);
} ez_svc_node_addrs SEC(".maps");

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

SEC("tc")
int ez_svc_nodeport(struct __sk_buff *skb)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, EZ_NP_ETH_HLEN);
	struct bpf_ct_opts opts = {};
	struct bpf_sock_tuple tuple = {};
	struct ez_svc_backend node = {};
	struct ez_svc_np_key nk = {};
	union nf_inet_addr nat = {};
	struct nf_conn___init *nct;
	struct ez_svc_backend *be;
	struct nf_conn *ct;
	struct ez_svc_np *np;
	struct ez_flow f = {};
	__u32 tsz, backend_id;

	if (skb->pkt_type != 0 /* PACKET_HOST */ || ez_parse(&p, false, &f) || !(f.flags & EZ_FLOW_PORTS))
		return TCX_NEXT;
	if (f.proto != EZ_IPPROTO_TCP && f.proto != EZ_IPPROTO_UDP)
		return TCX_NEXT;
	nk.port = f.dport;
	nk.proto = f.proto;
	nk.family = f.family;
	np = bpf_map_lookup_elem(&ez_svc_nodeports, &nk);
	if (!np)
		return TCX_NEXT;
	np_addr16(&f, f.daddr, node.addr);
	if (!bpf_map_lookup_elem(&ez_svc_node_addrs, &node))
		return TCX_NEXT;
	tsz = ez_ct_tuple(&f, &tuple);
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f.proto;
	ct = bpf_skb_ct_lookup(skb, &tuple, tsz, &opts, EZ_CT_OPTS_SZ);
	if (ct) {
		/* A SYN on the tuple of a closed flow (TIME_WAIT, CLOSE: a client
		 * reusing its port) reopens it in conntrack, which kills the
		 * entry and makes a new one without our NAT. So the old entry is
		 * expired now (timeout 0: the next lookup reaps it) and the flow
		 * set up anew. Any other known flow: conntrack NATs it. */
		__u8 state = ct->proto.tcp.state;
		int reopen = f.proto == EZ_IPPROTO_TCP && (f.tcp_flags & (EZ_TCP_SYN | EZ_TCP_ACK | EZ_TCP_RST)) == EZ_TCP_SYN &&
			     (state == TCP_CONNTRACK_TIME_WAIT || state == TCP_CONNTRACK_CLOSE);

		if (reopen)
			bpf_ct_change_timeout(ct, 0);
		bpf_ct_release(ct);
		if (!reopen)
			return TCX_NEXT;
		__builtin_memset(&opts, 0, sizeof(opts));
		opts.netns_id = BPF_F_CURRENT_NETNS;
		opts.l4proto = f.proto;
		ct = bpf_skb_ct_lookup(skb, &tuple, tsz, &opts, EZ_CT_OPTS_SZ);
		if (ct) {	/* still there: leave it to the kernel path */
			bpf_ct_release(ct);
			count(EZ_SVC_C_NP_CT_FAILED);
			return TCX_NEXT;
		}
		count(EZ_SVC_C_NP_REOPENED);
	}
	if (f.proto == EZ_IPPROTO_TCP && (f.tcp_flags & (EZ_TCP_SYN | EZ_TCP_ACK | EZ_TCP_RST)) != EZ_TCP_SYN) {
		count(EZ_SVC_C_NP_NOT_NEW);
		return TCX_NEXT;
	}
	if (!np->svc.count) {
		count(EZ_SVC_C_NP_NO_BACKEND);
		return TCX_NEXT;
	}
	be = choose_random(&np->svc, &backend_id);
	if (!be) {
		count(EZ_SVC_C_NP_NO_BACKEND);
		return TCX_NEXT;
	}
	__builtin_memset(&opts, 0, sizeof(opts));
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f.proto;
	nct = bpf_skb_ct_alloc(skb, &tuple, tsz, &opts, EZ_CT_OPTS_SZ);
	if (!nct) {
		count(EZ_SVC_C_NP_CT_FAILED);
		return TCX_NEXT;
	}
	np_nat_addr(&f, be->addr, &nat);
	if (bpf_ct_set_nat_info(nct, &nat, be->port, NF_NAT_MANIP_DST))
		goto failed;
	/* Source: Cluster masquerades to the node address the client used;
	 * Local keeps the client's address. Both let nf_nat choose another
	 * source port when the reply tuple is taken (another flow from the
	 * same client port to the same backend, e.g. in TIME_WAIT), as the
	 * kernel path's null binding does: without it the insert fails. */
	if (np->flags & EZ_SVC_NP_LOCAL)
		np_addr16(&f, f.saddr, node.addr);
	np_nat_addr(&f, node.addr, &nat);
	if (bpf_ct_set_nat_info(nct, &nat, -1, NF_NAT_MANIP_SRC))
		goto failed;
	bpf_ct_set_timeout(nct, EZ_NP_CT_TIMEOUT_MS);
	ct = bpf_ct_insert_entry(nct);
	if (!ct) {
		count(EZ_SVC_C_NP_CT_FAILED);	/* a racing packet inserted it: the kernel NATs by that */
		return TCX_NEXT;
	}
	bpf_ct_release(ct);
	count(EZ_SVC_C_NP_NEW);
	return TCX_NEXT;
failed:
	/* Quirk: an allocated entry cannot be released, only inserted
	 * (bpf_ct_release takes nf_conn, not nf_conn___init). It goes in for
	 * 1 s: this packet takes the kernel path un-NATed, a retransmission
	 * after that tries again. */
	bpf_ct_set_timeout(nct, 1000);
	ct = bpf_ct_insert_entry(nct);
	if (ct)
		bpf_ct_release(ct);
	count(EZ_SVC_C_NP_CT_FAILED);
	return TCX_NEXT;
}

#endif
