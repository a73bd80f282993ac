/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * cgroup_skb egress: learn the client's real (post-NAT) tuple from its SYN.
 * The hook runs in ip_finish_output/ip6_finish_output, after NF_INET_LOCAL_OUT
 * (REDIRECT, DNAT) and NF_INET_POST_ROUTING (SNAT) of the client's namespace,
 * so the addresses here are what the server will see if no other namespace
 * rewrites them. Every other packet returns after reading its TCP flags.
 */
#pragma once

#define EZ_ETH_P_IP 0x0800
#define EZ_ETH_P_IPV6 0x86DD
#define EZ_IPPROTO_TCP 6

struct ez_syn {
	struct ez_conn_key key;
	__u32 payload;
};

/* Parses a TCP SYN (without ACK) at the network header. Returns false for anything else. */
static __always_inline bool parse_syn(struct __sk_buff *skb, struct ez_syn *out)
{
	__u32 l4, tot;
	struct tcphdr th;

	if (skb->protocol == bpf_htons(EZ_ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)))
			return false;
		if (ip.protocol != EZ_IPPROTO_TCP || (ip.frag_off & bpf_htons(0x3fff)))
			return false;
		l4 = ip.ihl * 4;
		tot = bpf_ntohs(ip.tot_len);
		ip_from_v4(out->key.client_ip, ip.saddr);
		ip_from_v4(out->key.server_ip, ip.daddr);
	} else if (skb->protocol == bpf_htons(EZ_ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)))
			return false;
		/* Extension headers before TCP: not parsed, the socket stays unenrolled. */
		if (ip6.nexthdr != EZ_IPPROTO_TCP)
			return false;
		l4 = sizeof(ip6);
		tot = l4 + bpf_ntohs(ip6.payload_len);
		ip_from_v6(out->key.client_ip, ip6.saddr.in6_u.u6_addr32);
		ip_from_v6(out->key.server_ip, ip6.daddr.in6_u.u6_addr32);
	} else {
		return false;
	}
	if (bpf_skb_load_bytes(skb, l4, &th, sizeof(th)))
		return false;
	if (!th.syn || th.ack)
		return false;
	out->key.client_port = bpf_ntohs(th.source);
	out->key.server_port = bpf_ntohs(th.dest);
	out->payload = tot - l4 - th.doff * 4;
	return true;
}

SEC("cgroup_skb/egress")
int ez_egress(struct __sk_buff *skb)
{
	struct ez_syn syn = {};
	struct bpf_sock *sk;
	struct ez_sock *es;

	if (!parse_syn(skb, &syn))
		return 1;
	sk = skb->sk;
	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1;
	es = bpf_sk_storage_get(&ez_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!es) {
		count(EZ_C_FB_NO_STORAGE);
		return 1;
	}
	/* A retransmitted SYN keeps the first timestamp: claims must be newer than it. */
	if (!es->syn_ns)
		es->syn_ns = bpf_ktime_get_ns();
	es->key = syn.key;
	es->flags |= EZ_F_SYN_SEEN | EZ_F_CLIENT;
	if (syn.payload)
		es->flags |= EZ_F_SYN_DATA;
	return 1;
}
