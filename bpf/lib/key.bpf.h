/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Building the canonical connection key (struct ez_conn_key) from sockets and packets. */
#pragma once

#define EZ_AF_INET 2
#define EZ_AF_INET6 10

/* ::ffff:a.b.c.d, the IPv4 address given in network byte order. */
static __always_inline void ip_from_v4(__u8 *dst, __u32 addr_be)
{
	__u32 *d = (__u32 *)dst;

	d[0] = 0;
	d[1] = 0;
	d[2] = bpf_htonl(0x0000ffff);
	d[3] = addr_be;
}

static __always_inline void ip_from_v6(__u8 *dst, const __u32 *src)
{
	__u32 *d = (__u32 *)dst;

	d[0] = src[0];
	d[1] = src[1];
	d[2] = src[2];
	d[3] = src[3];
}

/* 127.0.0.0/8 (plain or v4-mapped) or ::1. */
static __always_inline bool ip_is_loopback(const __u8 *ip)
{
	const __u32 *a = (const __u32 *)ip;

	if (a[0] || a[1])
		return false;
	if (a[2] == bpf_htonl(0x0000ffff))
		return ip[12] == 127;
	return a[2] == 0 && a[3] == bpf_htonl(1);
}

static __always_inline bool key_needs_netns(const struct ez_conn_key *k)
{
	return ip_is_loopback(k->client_ip) || ip_is_loopback(k->server_ip);
}

/*
 * Key of a socket seen in sockops. The server side passes server=true: its
 * local end is the (post-NAT) server, its remote end the client. Quirk:
 * remote_port is the network-order port shifted left by 16 on little endian,
 * local_port is host order (net/core/filter.c sock_ops_convert_ctx_access).
 */
static __always_inline void key_from_sockops(struct bpf_sock_ops *s, struct ez_conn_key *k, bool server)
{
	__u8 *local = server ? k->server_ip : k->client_ip;
	__u8 *remote = server ? k->client_ip : k->server_ip;
	__u16 lport = s->local_port;
	__u16 rport = bpf_ntohl(s->remote_port);

	if (s->family == EZ_AF_INET) {
		ip_from_v4(local, s->local_ip4);
		ip_from_v4(remote, s->remote_ip4);
	} else {
		__u32 l[4] = { s->local_ip6[0], s->local_ip6[1], s->local_ip6[2], s->local_ip6[3] };
		__u32 r[4] = { s->remote_ip6[0], s->remote_ip6[1], s->remote_ip6[2], s->remote_ip6[3] };

		ip_from_v6(local, l);
		ip_from_v6(remote, r);
	}
	k->client_port = server ? rport : lport;
	k->server_port = server ? lport : rport;
	k->netns = key_needs_netns(k) ? bpf_get_netns_cookie(s) : 0;
}
