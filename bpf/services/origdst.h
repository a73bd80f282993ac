/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * SO_ORIGINAL_DST for sidecar proxies. A proxy that intercepts the
 * application's connections with iptables REDIRECT (Istio, Linkerd) asks
 * getsockopt(SO_ORIGINAL_DST) on the accepted socket where the application
 * meant to go. Conntrack answers with the destination the first packet had,
 * and with connect-time translation that is already the backend. So:
 * - ez_svc_orig_connect (sockops, TCP_CONNECT_CB: the source port is bound)
 *   records, for a socket connect4/6 translated, {netns, client address and
 *   port, backend} -> frontend in ez_svc_origdst;
 * - ez_svc_getsockopt (cgroup/getsockopt, runs after the kernel's answer)
 *   finds the accepted socket's peer and the kernel's answer there and
 *   answers with the frontend;
 * - ez_svc_orig_release (cgroup/sock_release: close) deletes the entry
 *   (its key is kept in the socket's storage): it lives exactly as long as
 *   the application's socket.
 * The proxy must be in the application's network namespace (a sidecar, or
 * an in-pod redirection). Quirks: cgroup/getsockopt cannot look sockets up
 * (no bpf_sk_lookup_tcp there), hence the map. sock_ops local_port is host
 * order; remote_port is the network-order port shifted into the upper 16
 * bits (sock_ops_convert_ctx_access on little endian), not the lower.
 */
#ifndef EZ_SERVICES_ORIGDST_H
#define EZ_SERVICES_ORIGDST_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "services/maps.h"

#define EZ_SOL_IP 0
#define EZ_SOL_IPV6 41
#define EZ_SO_ORIGINAL_DST 80		/* SOL_IP: struct sockaddr_in */
#define EZ_IP6T_SO_ORIGINAL_DST 80	/* SOL_IPV6: struct sockaddr_in6 */
#define EZ_AF_INET 2
#define EZ_AF_INET6 10

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct ez_svc_orig_key);
	__type(value, struct ez_svc_orig);
} ez_svc_origdst SEC(".maps");

static __always_inline void v4_to16(__u32 ip, __u8 out[16])
{
	__builtin_memset(out, 0, 10);
	out[10] = 0xff;
	out[11] = 0xff;
	__builtin_memcpy(out + 12, &ip, 4);
}

static __always_inline int is_v4_mapped(const __u8 a[16])
{
	for (int i = 0; i < 10; i++)
		if (a[i])
			return 0;
	return a[10] == 0xff && a[11] == 0xff;
}

/* The translation a TCP socket's connect made, if any (it has one). */
static __always_inline struct ez_svc_rev *tcp_rev(struct ez_svc_sock *s)
{
	if (!s)
		return NULL;
	for (int i = 0; i < EZ_SVC_SOCK_REVS; i++)
		if (s->rev[i].id)
			return &s->rev[i];
	return NULL;
}

SEC("sockops")
int ez_svc_orig_connect(struct bpf_sock_ops *skops)
{
	struct ez_svc_orig v = {};
	struct ez_svc_sock *s;
	struct ez_svc_rev *r;
	struct bpf_sock *sk;

	if (skops->op != BPF_SOCK_OPS_TCP_CONNECT_CB)
		return 1;
	sk = skops->sk;
	if (!sk)
		return 1;
	s = bpf_sk_storage_get(&ez_svc_socks, sk, NULL, 0);
	r = tcp_rev(s);
	if (!r)
		return 1;
	struct ez_svc_orig_key *k = &s->orig;

	__builtin_memset(k, 0, sizeof(*k));
	k->netns = bpf_get_netns_cookie(skops);
	if (skops->family == EZ_AF_INET) {
		v4_to16(skops->local_ip4, k->client);
		v4_to16(skops->remote_ip4, k->backend);
	} else {
		__u32 l[4] = { skops->local_ip6[0], skops->local_ip6[1], skops->local_ip6[2], skops->local_ip6[3] };
		__u32 rm[4] = { skops->remote_ip6[0], skops->remote_ip6[1], skops->remote_ip6[2], skops->remote_ip6[3] };

		__builtin_memcpy(k->client, l, 16);
		__builtin_memcpy(k->backend, rm, 16);
	}
	k->client_port = (__u16)skops->local_port;
	k->backend_port = bpf_ntohs((__u16)(skops->remote_port >> 16));
	__builtin_memcpy(v.vip, r->vip, 16);
	v.vip_port = r->vip_port;
	if (bpf_map_update_elem(&ez_svc_origdst, k, &v, BPF_ANY)) {
		k->netns = 0;
		count(EZ_SVC_C_ORIG_FULL);
	}
	return 1;
}

/* cgroup sock programs may not read a socket's addresses at release: the
 * key was kept in the socket's storage. */
SEC("cgroup/sock_release")
int ez_svc_orig_release(struct bpf_sock *ctx)
{
	struct ez_svc_sock *s;

	if (ctx->protocol != EZ_IPPROTO_TCP)
		return 1;
	s = bpf_sk_storage_get(&ez_svc_socks, ctx, NULL, 0);
	if (!s || !s->orig.netns)
		return 1;
	bpf_map_delete_elem(&ez_svc_origdst, &s->orig);
	s->orig.netns = 0;
	return 1;
}

SEC("cgroup/getsockopt")
int ez_svc_getsockopt(struct bpf_sockopt *ctx)
{
	struct ez_svc_orig_key k = {};
	struct ez_svc_orig *v;
	struct bpf_sock *sk = ctx->sk;
	void *end = ctx->optval_end;

	if (ctx->optname != EZ_SO_ORIGINAL_DST || ctx->retval != 0 || !sk)
		return 1;
	k.netns = bpf_get_netns_cookie(ctx);
	if (ctx->level == EZ_SOL_IP) {
		struct sockaddr_in *sin = ctx->optval;

		if ((void *)(sin + 1) > end || sin->sin_family != EZ_AF_INET || sk->family != EZ_AF_INET)
			return 1;
		v4_to16(sk->dst_ip4, k.client);
		v4_to16(sin->sin_addr.s_addr, k.backend);
		k.client_port = bpf_ntohs((__u16)sk->dst_port);
		k.backend_port = bpf_ntohs(sin->sin_port);
		v = bpf_map_lookup_elem(&ez_svc_origdst, &k);
		if (!v || !is_v4_mapped(v->vip))
			return 1;
		__builtin_memcpy(&sin->sin_addr.s_addr, v->vip + 12, 4);
		sin->sin_port = bpf_htons(v->vip_port);
	} else if (ctx->level == EZ_SOL_IPV6) {
		struct sockaddr_in6 *sin6 = ctx->optval;

		if ((void *)(sin6 + 1) > end || sin6->sin6_family != EZ_AF_INET6 || sk->family != EZ_AF_INET6)
			return 1;
		__u32 c[4] = { sk->dst_ip6[0], sk->dst_ip6[1], sk->dst_ip6[2], sk->dst_ip6[3] };

		__builtin_memcpy(k.client, c, 16);
		__builtin_memcpy(k.backend, &sin6->sin6_addr, 16);
		k.client_port = bpf_ntohs((__u16)sk->dst_port);
		k.backend_port = bpf_ntohs(sin6->sin6_port);
		v = bpf_map_lookup_elem(&ez_svc_origdst, &k);
		if (!v || is_v4_mapped(v->vip))
			return 1;
		__builtin_memcpy(&sin6->sin6_addr, v->vip, 16);
		sin6->sin6_port = bpf_htons(v->vip_port);
	} else {
		return 1;
	}
	count(EZ_SVC_C_ORIG_DST);
	return 1;
}

#endif
