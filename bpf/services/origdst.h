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
#include "services/backend.h"

#define EZ_SOL_IP 0
#define EZ_SOL_IPV6 41
#define EZ_SO_ORIGINAL_DST 80		/* SOL_IP: struct sockaddr_in */
#define EZ_IP6T_SO_ORIGINAL_DST 80	/* SOL_IPV6: struct sockaddr_in6 */
#define EZ_AF_INET 2
#define EZ_AF_INET6 10

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

#endif
