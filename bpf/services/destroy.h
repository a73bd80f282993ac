/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Sockets of a backend that left its frontend: the agent writes the
 * (frontend, backend) pairs in ez_svc_gone and runs these iterators in each
 * network namespace of the managed cgroups. A socket whose translation
 * (ez_svc_socks) is such a pair is destroyed with bpf_sock_destroy: a
 * connected UDP socket whenever its backend left the frontend (kube-proxy
 * deletes the conntrack entries of such UDP flows), a TCP socket only when
 * its backend is gone from the Service's endpoints altogether (a backend
 * that is not ready or terminating keeps its connections, as with
 * kube-proxy). TCP is aborted (the application sees ECONNABORTED, the
 * backend an RST); UDP gets ECONNABORTED at its next receive. A socket that
 * connected to the backend's address itself has no translation and is left
 * alone; so is an unconnected UDP socket (its next send chooses again).
 * Quirk: bpf_sock_destroy is allowed in iter/tcp and iter/udp only, which
 * hold the socket's lock (net/core/filter.c); the iterators walk the network
 * namespace of the process that creates the iterator.
 */
#ifndef EZ_SERVICES_DESTROY_H
#define EZ_SERVICES_DESTROY_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "services/backend.h"

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* Whether one of sk's translations went to a backend that left, for flag. */
static __always_inline int translated_to_gone(struct sock *sk, __u32 flag)
{
	struct ez_svc_sock *s = bpf_sk_storage_get(&ez_svc_socks, sk, NULL, 0);

	if (!s)
		return 0;
	for (int i = 0; i < EZ_SVC_SOCK_REVS; i++) {
		struct ez_svc_rev *r = &s->rev[i];
		struct ez_svc_gone_key k = {};

		if (!r->id)
			continue;
		__builtin_memcpy(k.addr, r->backend, 16);
		k.port = r->backend_port;
		k.id = r->id;
		__u32 *v = bpf_map_lookup_elem(&ez_svc_gone, &k);

		if (v && (*v & flag))
			return 1;
	}
	return 0;
}

/*
 * Kernels without bpf_sock_destroy (before Linux 6.5): the same choice of
 * sockets, written to the iterator's reader, which destroys each one with
 * sock_diag SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY) by address and cookie.
 */
static __always_inline void gone_sock_write(struct seq_file *seq, struct sock *sk, __u8 proto)
{
	struct ez_svc_gone_sock rec = {};

	rec.cookie = bpf_get_socket_cookie(sk);
	rec.proto = proto;
	rec.sport = sk->__sk_common.skc_num;
	rec.dport = bpf_ntohs(sk->__sk_common.skc_dport);
	if (sk->__sk_common.skc_family == 2 /* AF_INET */) {
		__u32 s = sk->__sk_common.skc_rcv_saddr, d = sk->__sk_common.skc_daddr;

		rec.family = 4;
		rec.src[10] = rec.src[11] = 0xff;
		rec.dst[10] = rec.dst[11] = 0xff;
		__builtin_memcpy(&rec.src[12], &s, 4);
		__builtin_memcpy(&rec.dst[12], &d, 4);
	} else {
		rec.family = 6;
		__builtin_memcpy(rec.src, sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8, 16);
		__builtin_memcpy(rec.dst, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr8, 16);
	}
	bpf_seq_write(seq, &rec, sizeof(rec));
}

#endif
