/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * IPv4/IPv6 + TCP/UDP header parsing, shared by the skb programs (cgroup_skb,
 * tc: bytes read from the linear data, else with bpf_skb_load_bytes) and the
 * tracer (bytes read from kernel memory with bpf_probe_read_kernel). Reads
 * never go past ez_pkt.len, so a truncated packet yields what it holds and no
 * more.
 */
#ifndef EZ_LIB_PARSE_H
#define EZ_LIB_PARSE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define EZ_ETH_P_IP 0x0800
#define EZ_ETH_P_IPV6 0x86DD
#define EZ_IPPROTO_TCP 6
#define EZ_IPPROTO_UDP 17

/* TCP flags: byte 13 of the TCP header. */
#define EZ_TCP_FIN 0x01
#define EZ_TCP_SYN 0x02
#define EZ_TCP_RST 0x04
#define EZ_TCP_ACK 0x10

/* Where a packet's network header is. */
struct ez_pkt {
	struct __sk_buff *skb;	/* bpf_skb_load_bytes from offset off (skb programs) */
	const void *kern;	/* or kernel memory at the network header (tracing programs) */
	__u32 off;		/* network header offset in skb */
	__u32 len;		/* bytes readable from the network header on */
	__u16 eth_proto;	/* ETH_P_*, host order (skb->protocol) */
};

enum ez_flow_flag {
	EZ_FLOW_PORTS = 1,	/* sport and dport were read */
	EZ_FLOW_TCP = 2,	/* tcp_flags and payload were read (TCP only) */
	EZ_FLOW_FRAG = 4,	/* an IPv4 fragment: first (MF) or later (offset) */
};

/* What ez_parse found. Addresses as the header has them: IPv4 in word 0. */
struct ez_flow {
	__u32 saddr[4];
	__u32 daddr[4];
	__u32 l4off;		/* transport header offset from the network header */
	__u32 payload;		/* TCP payload bytes by the IP length fields */
	__u16 sport;		/* host order */
	__u16 dport;
	__u8 family;		/* 4 or 6 */
	__u8 proto;		/* IPPROTO_*; IPv6: the first next header */
	__u8 tcp_flags;		/* EZ_TCP_* */
	__u8 flags;		/* enum ez_flow_flag */
};

/*
 * bpf_skb_load_bytes, with bytes in the skb's linear data read directly
 * (skb->data is where bpf_skb_load_bytes counts from: the network header for
 * cgroup_skb, the MAC header for tc): a helper call costs more than the whole
 * rest of a program that decides to do nothing. Bytes beyond it (paged data)
 * go through the helper. Inlined with a constant n, so the copy unrolls.
 */
static __always_inline long ez_skb_read(struct __sk_buff *skb, __u32 off, void *dst, __u32 n)
{
	const __u8 *data = (const __u8 *)(long)skb->data;
	const __u8 *end = (const __u8 *)(long)skb->data_end;

	/* The bound keeps off + n within the verifier's packet range (MAX_PACKET_OFF). */
	if (off < 0x8000 && data + off + n <= end) {
		__builtin_memcpy(dst, data + off, n);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, dst, n);
}

/* kern is a constant at every call site: the other branch is compiled out,
 * so skb programs never call bpf_probe_read_kernel and tracing programs
 * never read an skb. */
static __always_inline long ez_pkt_read(const struct ez_pkt *p, bool kern, __u32 off, void *dst, __u32 n)
{
	if (off > p->len || n > p->len - off)
		return -1;
	if (kern)
		return bpf_probe_read_kernel(dst, n, p->kern + off);
	return ez_skb_read(p->skb, p->off + off, dst, n);
}

/*
 * Fills f from the network header on. Returns 0 for IPv4 or IPv6 (whose
 * version matches eth_proto), -1 otherwise or when the IP header is cut
 * short. Ports are read for TCP and UDP, except in later IPv4 fragments;
 * IPv6 extension headers are not walked (proto is the first next header).
 */
static __always_inline int ez_parse(const struct ez_pkt *p, bool kern, struct ez_flow *f)
{
	__u32 tot;
	__u8 b0;

	if (p->eth_proto != EZ_ETH_P_IP && p->eth_proto != EZ_ETH_P_IPV6)
		return -1;
	if (ez_pkt_read(p, kern, 0, &b0, 1))
		return -1;
	if ((b0 >> 4) == 4 && p->eth_proto == EZ_ETH_P_IP) {
		struct iphdr ip;
		__u16 frag;

		if (ez_pkt_read(p, kern, 0, &ip, sizeof(ip)))
			return -1;
		if (ip.ihl < 5)
			return -1;
		f->family = 4;
		f->proto = ip.protocol;
		f->saddr[0] = ip.saddr;
		f->daddr[0] = ip.daddr;
		f->l4off = ip.ihl * 4;
		tot = bpf_ntohs(ip.tot_len);
		frag = bpf_ntohs(ip.frag_off);
		if (frag & 0x3fff)
			f->flags |= EZ_FLOW_FRAG;
		if (frag & 0x1fff)
			return 0; /* later fragments carry no transport header */
	} else if ((b0 >> 4) == 6 && p->eth_proto == EZ_ETH_P_IPV6) {
		struct ipv6hdr ip6;

		if (ez_pkt_read(p, kern, 0, &ip6, sizeof(ip6)))
			return -1;
		f->family = 6;
		f->proto = ip6.nexthdr;
		__builtin_memcpy(f->saddr, &ip6.saddr, 16);
		__builtin_memcpy(f->daddr, &ip6.daddr, 16);
		f->l4off = sizeof(ip6);
		tot = sizeof(ip6) + bpf_ntohs(ip6.payload_len);
	} else {
		return -1;
	}
	if (f->proto == EZ_IPPROTO_TCP || f->proto == EZ_IPPROTO_UDP) {
		__u16 ports[2];

		if (ez_pkt_read(p, kern, f->l4off, ports, sizeof(ports)))
			return 0;
		f->sport = bpf_ntohs(ports[0]);
		f->dport = bpf_ntohs(ports[1]);
		f->flags |= EZ_FLOW_PORTS;
	}
	if (f->proto == EZ_IPPROTO_TCP) {
		__u8 b[2]; /* data offset, flags */
		__u32 hdrs;

		if (ez_pkt_read(p, kern, f->l4off + 12, b, sizeof(b)))
			return 0;
		f->tcp_flags = b[1];
		hdrs = f->l4off + (b[0] >> 4) * 4;
		f->payload = tot > hdrs ? tot - hdrs : 0;
		f->flags |= EZ_FLOW_TCP;
	}
	return 0;
}

#define EZ_QUICK_NOT_TCP (-1)
#define EZ_QUICK_UNKNOWN (-2)

/*
 * A cheap first look for skb programs that act only on a few TCP segments
 * (SYN, FIN) and run on every packet: the TCP flags byte, read straight
 * from the linear data, with the network header at off (constant: 0 for
 * cgroup_skb, the Ethernet header's length for tc). Returns
 *  - EZ_QUICK_NOT_TCP when ez_parse would report no TCP flags outside a
 *    fragment: not IPv4 or IPv6 (skb->protocol and version), an IPv4
 *    header length below 5, an IPv4 fragment (first or later), or a
 *    protocol or first next header other than TCP;
 *  - EZ_QUICK_UNKNOWN when those headers are not all in the linear data
 *    (ez_parse decides);
 *  - else the flags byte, the one ez_parse would read.
 */
static __always_inline int ez_tcp_flags_quick(struct __sk_buff *skb, __u32 off)
{
	const __u8 *data = (const __u8 *)(long)skb->data;
	const __u8 *end = (const __u8 *)(long)skb->data_end;
	const __u8 *ip = data + off;
	const __u8 *l4;
	__u16 proto = bpf_ntohs(skb->protocol);

	if (proto == EZ_ETH_P_IP) {
		if (ip + 20 > end)
			return EZ_QUICK_UNKNOWN;
		if ((ip[0] >> 4) != 4 || (ip[0] & 0xf) < 5)
			return EZ_QUICK_NOT_TCP;
		if (ip[9] != EZ_IPPROTO_TCP || (ip[6] & 0x3f) || ip[7]) /* frag_off & 0x3fff */
			return EZ_QUICK_NOT_TCP;
		l4 = ip + (ip[0] & 0xf) * 4;
	} else if (proto == EZ_ETH_P_IPV6) {
		if (ip + 40 > end)
			return EZ_QUICK_UNKNOWN;
		if ((ip[0] >> 4) != 6 || ip[6] != EZ_IPPROTO_TCP)
			return EZ_QUICK_NOT_TCP;
		l4 = ip + 40;
	} else {
		return EZ_QUICK_NOT_TCP;
	}
	if (l4 + 14 > end)
		return EZ_QUICK_UNKNOWN;
	return l4[13];
}

/* The network header of an skb program's packet: cgroup_skb sees it at
 * offset 0, tc at the end of the Ethernet header. */
static __always_inline struct ez_pkt ez_pkt_of_skb(struct __sk_buff *skb, __u32 off)
{
	struct ez_pkt p = {
		.skb = skb,
		.off = off,
		.len = skb->len > off ? skb->len - off : 0,
		.eth_proto = bpf_ntohs(skb->protocol),
	};

	return p;
}

#endif
