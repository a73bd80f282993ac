/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * netfilter (BPF netfilter link, in the agent's namespace, at POST_ROUTING
 * after SNAT): learn NAT done in this namespace for traffic it forwards, as
 * kube-proxy's ClusterIP/NodePort DNAT does for pod traffic. Neither end's
 * own packets show it: the client's SYN leaves its pod for the ClusterIP, the
 * server's SYN-ACK leaves its pod un-NATed. Conntrack knows both tuples: for
 * the first packet of a DST-NATed TCP connection write
 * ez_sc_aliases[client's key] -> the key the server will register.
 * Netfilter programs get no conntrack kfuncs; skb->_nfct is read directly.
 * The same learning runs from one of four places, best first:
 *  - fentry/__nf_conntrack_confirm (ez_sc_nat_ct): conntrack confirms a
 *    connection's entry once, at its first packet's last netfilter hook
 *    (nf_confirm at POST_ROUTING or LOCAL_IN, priority INT_MAX, after every
 *    NAT), so it runs once per new connection instead of once per packet.
 *    It also sees connections delivered to this namespace's own sockets
 *    (LOCAL_IN), which the other two do not: their alias is as exact (both
 *    tuples are conntrack's), so such a connection can pair too. Where the
 *    kernel refuses tracing programs on functions (hardened hosts; some
 *    refuse them to any process but PID 1) or nf_conntrack is not loaded
 *    when the agent starts:
 *  - the close reset's tc program (ez_sc_close_reset, EZ_CFG_NAT_TC: below)
 *    at a pod server's SYN-ACK, from a conntrack lookup: no hook of its
 *    own, once per connection, where the conntrack kfuncs are there. It
 *    does not see connections delivered to this namespace's own sockets.
 *    Without the kfuncs (nf_conntrack not loaded), or the close reset:
 *  - the netfilter link at POST_ROUTING (ez_sc_nat, Linux 6.4): every packet
 *    the namespace forwards or sends;
 *  - tp_btf/net_dev_queue (ez_sc_nat_dev), before 6.4: a forwarded SYN is
 *    queued to the server's veth after POST_ROUTING, with its conntrack
 *    entry attached, and before the server can see it; every transmit.
 */
#ifndef EZ_SHORTCUT_NAT_H
#define EZ_SHORTCUT_NAT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "lib/addr.h"
#include "lib/parse.h"
#define EZ_CT_WEAK /* the conntrack kfuncs weak (lib/ct.h, nat_learn_synack) */
#include "lib/ct.h"
#include "shortcut/key.h"
#include "shortcut/control.h"

#define EZ_NF_ACCEPT 1
#define EZ_NFCT_PTRMASK (~7UL)

static __always_inline bool key_from_ct_tuple(struct ez_conn_key *k, const struct nf_conntrack_tuple *t, bool reply)
{
	/* orig: src = client, dst = server; reply: src = server, dst = client */
	const union nf_inet_addr *c = reply ? &t->dst.u3 : &t->src.u3;
	const union nf_inet_addr *s = reply ? &t->src.u3 : &t->dst.u3;
	__be16 cp = reply ? t->dst.u.tcp.port : t->src.u.all;
	__be16 sp = reply ? t->src.u.all : t->dst.u.tcp.port;

	if (t->src.l3num == EZ_AF_INET) {
		ip_from_v4(k->client_ip, c->ip);
		ip_from_v4(k->server_ip, s->ip);
	} else if (t->src.l3num == EZ_AF_INET6) {
		ip_from_v6(k->client_ip, c->ip6);
		ip_from_v6(k->server_ip, s->ip6);
	} else {
		return false;
	}
	k->client_port = bpf_ntohs(cp);
	k->server_port = bpf_ntohs(sp);
	return true;
}

/* Learns the alias of the connection of conntrack entry ct if it is
 * DST-NATed: its client's key -> the key its server registers. */
static __always_inline void nat_learn_ct(struct nf_conn *ct)
{
	struct ez_conn_key wire = {}, post = {};
	struct nf_conntrack_tuple orig, reply;
	struct ez_alias alias = {};
	struct ez_alias *old;
	long err;

	if (!ct || !(BPF_CORE_READ(ct, status) & IPS_DST_NAT))
		return;
	if (bpf_core_read(&orig, sizeof(orig), &ct->tuplehash[IP_CT_DIR_ORIGINAL].tuple) ||
	    bpf_core_read(&reply, sizeof(reply), &ct->tuplehash[IP_CT_DIR_REPLY].tuple))
		return;
	if (orig.dst.protonum != EZ_IPPROTO_TCP)
		return;
	if (!key_from_ct_tuple(&wire, &orig, false) || !key_from_ct_tuple(&post, &reply, true))
		return;
	/* Loopback NAT stays inside one namespace, where the client's egress
	 * program already sees it. */
	if (key_needs_netns(&wire) || key_needs_netns(&post))
		return;
	alias.created_ns = bpf_ktime_get_ns();
	alias.target = post;
	err = bpf_map_update_elem(&ez_sc_aliases, &wire, &alias, BPF_NOEXIST);
	if (!err) {
		count(EZ_C_NAT_ALIASES);
		return;
	}
	if (err != -EEXIST) {
		count_insert_error(err);
		return;
	}
	old = bpf_map_lookup_elem(&ez_sc_aliases, &wire);
	if (old && !key_equal(&old->target, &post)) {
		old->created_ns = 0; /* two translations of one client tuple: follow neither */
		count(EZ_C_FB_AMBIGUOUS);
	}
}

/* Learns the alias of skb's connection: its first packet, DST-NATed. */
static __always_inline void nat_learn(struct sk_buff *skb)
{
	unsigned long nfct;

	/* Runs for every packet through POST_ROUTING (or every transmit, or once
	 * per new connection): skb is a trusted BTF pointer in these callers,
	 * so _nfct is one direct load, not a bpf_probe_read_kernel call (which
	 * more than doubled the program's run time). Only a connection's first
	 * packet goes on. */
	nfct = skb->_nfct;
	if ((nfct & ~EZ_NFCT_PTRMASK) != IP_CT_NEW)
		return;
	nat_learn_ct((struct nf_conn *)(nfct & EZ_NFCT_PTRMASK));
}

static __always_inline void nat_learn_here(struct sk_buff *skb)
{
	if (BPF_CORE_READ(skb, dev, nd_net.net, net_cookie) == ez_cfg_nat_netns)
		nat_learn(skb);
}

/*
 * The close reset's tc program (ez_sc_close_reset) learns the same at a
 * connection's SYN-ACK where the fentry is refused (EZ_CFG_NAT_TC, set by
 * the agent), so that no hook runs for the NAT learner on other packets:
 * the tc program runs for every packet of the pods' veths anyway and
 * leaves after one flags byte. A pod server's SYN-ACK enters the agent's
 * namespace at its veth's ingress before conntrack undoes the DNAT: its
 * tuple is the entry's reply tuple, and the client has not seen the
 * SYN-ACK yet (it claims at its ESTABLISHED, pair.h), so the alias is
 * there in time, younger than the client's SYN as the claim requires.
 * The conntrack kfuncs are weak: where nf_conntrack is not loaded (the
 * agent then uses a NAT hook instead) the program loads without them.
 */

/* SYN and ACK, neither RST nor FIN: a SYN-ACK the tc program learns from. */
static __always_inline bool nat_synack_flags(__u8 flags)
{
	return (ez_cfg_flags & EZ_CFG_NAT_TC) &&
	       (flags & (EZ_TCP_SYN | EZ_TCP_ACK | EZ_TCP_RST | EZ_TCP_FIN)) == (EZ_TCP_SYN | EZ_TCP_ACK);
}

static __always_inline void nat_learn_synack(struct __sk_buff *skb, const struct ez_flow *f)
{
	struct bpf_sock_tuple tuple = {};
	struct bpf_ct_opts opts = {};
	struct nf_conn *ct;
	__u32 tuple_sz;

	if (!bpf_skb_ct_lookup || !bpf_ct_release)
		return; /* weak: nf_conntrack not loaded when the program loaded */
	tuple_sz = ez_ct_tuple(f, &tuple);
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = EZ_IPPROTO_TCP;
	ct = bpf_skb_ct_lookup(skb, &tuple, tuple_sz, &opts, EZ_CT_OPTS_SZ);
	if (!ct)
		return;
	/* The reply direction (the server's SYN-ACK before un-DNAT), and only
	 * the agent's namespace's conntrack (the program also runs on pods'
	 * own loopback devices). */
	if (opts.dir == IP_CT_DIR_REPLY && BPF_CORE_READ(ct, ct_net.net, net_cookie) == ez_cfg_nat_netns)
		nat_learn_ct(ct);
	bpf_ct_release(ct);
}

#endif
