/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Building the canonical connection key (struct ez_conn_key) from sockets. */
#ifndef EZ_SHORTCUT_KEY_H
#define EZ_SHORTCUT_KEY_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lib/addr.h"
#include "shortcut/shortcut.h"

static __always_inline bool key_needs_netns(const struct ez_conn_key *k)
{
	return ip_is_loopback(k->client_ip) || ip_is_loopback(k->server_ip);
}

/* The netns cookie belongs in the key only when an end is loopback. */
static __always_inline void key_set_netns(struct ez_conn_key *k, __u64 cookie)
{
	k->netns = key_needs_netns(k) ? cookie : 0;
}

static __always_inline bool key_equal(const struct ez_conn_key *a, const struct ez_conn_key *b)
{
	return !__builtin_memcmp(a, b, sizeof(*a));
}

/*
 * Sets the addresses and ports of k from a socket's ends as sockops reports
 * them (struct ez_sock_ends). The server side passes server=true: its local
 * end is the (post-NAT) server, its remote end the client. Quirk:
 * remote_port is the network-order port shifted left by 16 on little endian,
 * local_port is host order (net/core/filter.c sock_ops_convert_ctx_access).
 */
static __always_inline void key_from_ends(struct ez_conn_key *k, const struct ez_sock_ends *e, bool server)
{
	__u8 *local = server ? k->server_ip : k->client_ip;
	__u8 *remote = server ? k->client_ip : k->server_ip;
	__u16 lport = e->local_port;
	__u16 rport = bpf_ntohl(e->remote_port);

	if (e->family == EZ_AF_INET) {
		ip_from_v4(local, e->local_ip4);
		ip_from_v4(remote, e->remote_ip4);
	} else {
		ip_from_v6(local, e->local_ip6);
		ip_from_v6(remote, e->remote_ip6);
	}
	k->client_port = server ? rport : lport;
	k->server_port = server ? lport : rport;
}

/*
 * One u32 field of struct bpf_sock_ops, loaded at its constant offset.
 * Quirk: plain field reads let clang share one ctx+offset pointer between
 * call sites, which the verifier refuses ("dereference of modified ctx ptr").
 */
#define EZ_SOCKOPS_U32(s, field) ({						\
	__u32 __v;								\
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(__v)			\
		     : "r"(s), "i"(__builtin_offsetof(struct bpf_sock_ops, field)));	\
	__v;									\
})

/* Key of a socket seen in sockops. */
static __always_inline void key_from_sockops(struct bpf_sock_ops *s, struct ez_conn_key *k, bool server)
{
	struct ez_sock_ends e = {
		.family = EZ_SOCKOPS_U32(s, family),
		.local_port = EZ_SOCKOPS_U32(s, local_port),
		.remote_port = EZ_SOCKOPS_U32(s, remote_port),
	};

	if (e.family == EZ_AF_INET) {
		e.local_ip4 = EZ_SOCKOPS_U32(s, local_ip4);
		e.remote_ip4 = EZ_SOCKOPS_U32(s, remote_ip4);
	} else {
		e.local_ip6[0] = EZ_SOCKOPS_U32(s, local_ip6[0]);
		e.local_ip6[1] = EZ_SOCKOPS_U32(s, local_ip6[1]);
		e.local_ip6[2] = EZ_SOCKOPS_U32(s, local_ip6[2]);
		e.local_ip6[3] = EZ_SOCKOPS_U32(s, local_ip6[3]);
		e.remote_ip6[0] = EZ_SOCKOPS_U32(s, remote_ip6[0]);
		e.remote_ip6[1] = EZ_SOCKOPS_U32(s, remote_ip6[1]);
		e.remote_ip6[2] = EZ_SOCKOPS_U32(s, remote_ip6[2]);
		e.remote_ip6[3] = EZ_SOCKOPS_U32(s, remote_ip6[3]);
	}
	key_from_ends(k, &e, server);
	k->netns = key_needs_netns(k) ? bpf_get_netns_cookie(s) : 0;
}

#endif
