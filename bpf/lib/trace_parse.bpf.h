/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow tuple of an sk_buff, and the kernel-side filter. */
#pragma once

/* Where the IP header is, relative to what each hook sees. */
enum trc_l3 {
	TRC_L3_NET,	/* skb->head + network_header (netfilter, tcx) */
	TRC_L3_DATA,	/* skb->data (RX after eth_type_trans) */
	TRC_L3_ETH,	/* skb->data + ETH_HLEN (TX at dev_queue_xmit) */
};

#define TRC_ETH_P_IP 0x0800
#define TRC_ETH_P_IPV6 0x86DD

/* Flow tuple, on the stack until the filter has matched. */
struct trc_flow {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport;
	__u16 dport;
	__u8 family;
	__u8 proto;
	__u16 _pad;
};

/* parse fills family, proto, addresses and ports of r. IPv6 extension
 * headers are not walked: ports stay 0 behind one. Returns 0 for IP. */
static __always_inline int trc_parse(struct sk_buff *skb, enum trc_l3 where, struct trc_flow *r)
{
	unsigned char *head = BPF_CORE_READ(skb, head);
	unsigned char *l3;
	__u16 proto = bpf_ntohs(BPF_CORE_READ(skb, protocol));
	__u32 l4off;
	__u8 b0;

	switch (where) {
	case TRC_L3_NET:
		l3 = head + BPF_CORE_READ(skb, network_header);
		break;
	case TRC_L3_DATA:
		l3 = BPF_CORE_READ(skb, data);
		break;
	default:
		l3 = BPF_CORE_READ(skb, data) + 14;
		break;
	}
	if (proto != TRC_ETH_P_IP && proto != TRC_ETH_P_IPV6)
		return -1;
	if (bpf_probe_read_kernel(&b0, 1, l3))
		return -1;
	if ((b0 >> 4) == 4) {
		struct iphdr ip;

		if (bpf_probe_read_kernel(&ip, sizeof(ip), l3))
			return -1;
		r->family = 4;
		r->proto = ip.protocol;
		r->saddr[0] = ip.saddr;
		r->daddr[0] = ip.daddr;
		l4off = (ip.ihl & 0xf) * 4;
		/* Later fragments carry no ports. */
		if (bpf_ntohs(ip.frag_off) & 0x1fff)
			return 0;
	} else if ((b0 >> 4) == 6) {
		struct ipv6hdr ip6;

		if (bpf_probe_read_kernel(&ip6, sizeof(ip6), l3))
			return -1;
		r->family = 6;
		r->proto = ip6.nexthdr;
		__builtin_memcpy(r->saddr, &ip6.saddr, 16);
		__builtin_memcpy(r->daddr, &ip6.daddr, 16);
		l4off = sizeof(ip6);
	} else {
		return -1;
	}
	if (r->proto == IPPROTO_TCP || r->proto == IPPROTO_UDP) {
		__u16 ports[2];

		if (!bpf_probe_read_kernel(ports, sizeof(ports), l3 + l4off)) {
			r->sport = bpf_ntohs(ports[0]);
			r->dport = bpf_ntohs(ports[1]);
		}
	}
	return 0;
}

static __always_inline bool trc_addr_eq(const __u32 *a, __u8 family)
{
	if (family == 4)
		return a[0] == f_host[0];
	return a[0] == f_host[0] && a[1] == f_host[1] && a[2] == f_host[2] && a[3] == f_host[3];
}

/* The filter: every configured field must match. */
static __always_inline bool trc_match(const struct trc_flow *r, __u32 ifindex, __u64 netns)
{
	if (f_family && r->family != f_family)
		return false;
	if (f_proto && r->proto != f_proto)
		return false;
	if (f_port && r->sport != f_port && r->dport != f_port)
		return false;
	if (f_sport && r->sport != f_sport)
		return false;
	if (f_dport && r->dport != f_dport)
		return false;
	if (f_host_set && !trc_addr_eq(r->saddr, r->family) && !trc_addr_eq(r->daddr, r->family))
		return false;
	if (f_ifindex && ifindex != f_ifindex)
		return false;
	if (f_netns && netns != f_netns)
		return false;
	return true;
}
