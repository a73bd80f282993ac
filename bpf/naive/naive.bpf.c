// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * A naive sockmap, for the lab only (bench hops): the model of the peers
 * eztunnel is measured against. sockops puts every established TCP socket
 * of the cgroup into a sockhash keyed by its 4-tuple, and into a second one
 * keyed by the connection's client end; sk_msg redirects each message into
 * the socket of the reversed tuple or, through iptables REDIRECT, the one
 * that shares its client end, and does nothing else: pairing inferred from
 * addresses, no read accounting, no unread bound, no splice guard, no
 * ordering proof. Never for the agent: it is unsafe by design.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lib/counters.h"
#include "naive/naive.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define EZ_AF_INET 2
#define EZ_AF_INET6 10

/*
 * One u32 field of a context, loaded at its constant offset. Quirk: plain
 * field reads let clang share one ctx+offset pointer between reads, which
 * the verifier refuses ("dereference of modified ctx ptr"); as
 * shortcut/key.h's EZ_SOCKOPS_U32.
 */
#define EZ_CTX_U32(ctx, type, field) ({						\
	__u32 __v;								\
	asm volatile("%0 = *(u32 *)(%1 + %2)" : "=r"(__v)			\
		     : "r"(ctx), "i"(__builtin_offsetof(type, field)));		\
	__v;									\
})

/* A socket's IPv4 addresses: AF_INET, or AF_INET6 with both ends v4-mapped
 * (a dual-stack listener's, e.g. Go's ":port"). False for other sockets. */
#define EZ_NAIVE_V4(ctx, type, local, remote) ({				\
	bool __ok = true;							\
	__u32 __fam = EZ_CTX_U32(ctx, type, family);				\
	if (__fam == EZ_AF_INET) {						\
		local = EZ_CTX_U32(ctx, type, local_ip4);			\
		remote = EZ_CTX_U32(ctx, type, remote_ip4);			\
	} else if (__fam == EZ_AF_INET6 &&					\
		   !EZ_CTX_U32(ctx, type, local_ip6[0]) &&			\
		   !EZ_CTX_U32(ctx, type, local_ip6[1]) &&			\
		   EZ_CTX_U32(ctx, type, local_ip6[2]) == bpf_htonl(0xffff) &&	\
		   !EZ_CTX_U32(ctx, type, remote_ip6[0]) &&			\
		   !EZ_CTX_U32(ctx, type, remote_ip6[1]) &&			\
		   EZ_CTX_U32(ctx, type, remote_ip6[2]) == bpf_htonl(0xffff)) {	\
		local = EZ_CTX_U32(ctx, type, local_ip6[3]);			\
		remote = EZ_CTX_U32(ctx, type, remote_ip6[3]);			\
	} else {								\
		__ok = false;							\
	}									\
	__ok;									\
})

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct ez_naive_tuple);
	__type(value, __u64);
} ez_naive_by_tuple SEC(".maps");

/* No sk_msg program on this one: a socket's psock takes its programs from
 * the first map (by_tuple), and a second parser would be refused (EBUSY). */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct ez_naive_end);
	__type(value, __u64);
} ez_naive_by_client SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_NAIVE_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ez_naive_counters SEC(".maps");

/*
 * Ports whose sockets stay out of the sockhashes, and so on the kernel
 * path (set before load; 0 ends the list): a socket is left out when
 * either of its ports is one. The paired demo (bench lab --b2b-datapath
 * naive) takes its A phases through them, as the agent's --exclude-ports.
 * Per connection only: sk_msg is as before.
 */
volatile const __u16 ez_naive_skip_ports[EZ_NAIVE_SKIP_MAX] = {};

/* Helpers (headers): they use the maps above. */

static __always_inline void count(__u32 c)
{
	ez_counter_add(&ez_naive_counters, c, 1);
}

static __always_inline bool skipped(__u32 lport, __u32 rport)
{
#pragma unroll
	for (int i = 0; i < EZ_NAIVE_SKIP_MAX; i++) {
		__u16 p = ez_naive_skip_ports[i];

		if (!p)
			break;
		if (p == lport || p == rport)
			return true;
	}
	return false;
}

SEC("sockops")
int ez_naive_sockops(struct bpf_sock_ops *s)
{
	struct ez_naive_tuple t = {};
	struct ez_naive_end e = {};
	__u32 op = EZ_CTX_U32(s, struct bpf_sock_ops, op);

	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (!EZ_NAIVE_V4(s, struct bpf_sock_ops, t.local_ip4, t.remote_ip4))
		return 1;
	t.local_port = EZ_CTX_U32(s, struct bpf_sock_ops, local_port);
	/* network-order port in the upper 16 bits on little endian */
	t.remote_port = bpf_ntohl(EZ_CTX_U32(s, struct bpf_sock_ops, remote_port));
	if (skipped(t.local_port, t.remote_port)) {
		count(EZ_NAIVE_C_SKIPPED);
		return 1;
	}
	if (op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB) {
		e.ip4 = t.local_ip4;
		e.port = t.local_port;
		e.role = EZ_NAIVE_ACTIVE;
	} else {
		e.ip4 = t.remote_ip4;
		e.port = t.remote_port;
		e.role = EZ_NAIVE_PASSIVE;
	}
	if (bpf_sock_hash_update(s, &ez_naive_by_tuple, &t, BPF_ANY) ||
	    bpf_sock_hash_update(s, &ez_naive_by_client, &e, BPF_ANY)) {
		count(EZ_NAIVE_C_INSERT_FAIL);
		return 1;
	}
	count(EZ_NAIVE_C_INSERTED);
	return 1;
}

SEC("sk_msg")
int ez_naive_msg(struct sk_msg_md *m)
{
	struct ez_naive_tuple t = {};
	struct ez_naive_end e = {};
	__u32 local, remote, lport, rport;

	if (!EZ_NAIVE_V4(m, struct sk_msg_md, local, remote))
		return SK_PASS;
	lport = EZ_CTX_U32(m, struct sk_msg_md, local_port);
	rport = bpf_ntohl(EZ_CTX_U32(m, struct sk_msg_md, remote_port));
	/* The peer's tuple: this socket's, reversed. */
	t.local_ip4 = remote;
	t.remote_ip4 = local;
	t.local_port = rport;
	t.remote_port = lport;
	if (bpf_msg_redirect_hash(m, &ez_naive_by_tuple, &t, BPF_F_INGRESS) == SK_PASS) {
		count(EZ_NAIVE_C_BY_TUPLE);
		return SK_PASS;
	}
	/* REDIRECT rewrote the destination: an active socket's peer is the
	 * passive one whose remote end is this local end, and back. */
	e.ip4 = local;
	e.port = lport;
	e.role = EZ_NAIVE_PASSIVE;
	if (bpf_msg_redirect_hash(m, &ez_naive_by_client, &e, BPF_F_INGRESS) == SK_PASS) {
		count(EZ_NAIVE_C_BY_CLIENT);
		return SK_PASS;
	}
	e.ip4 = remote;
	e.port = rport;
	e.role = EZ_NAIVE_ACTIVE;
	if (bpf_msg_redirect_hash(m, &ez_naive_by_client, &e, BPF_F_INGRESS) == SK_PASS) {
		count(EZ_NAIVE_C_BY_CLIENT);
		return SK_PASS;
	}
	count(EZ_NAIVE_C_PASS);
	return SK_PASS;
}

/* Referenced so that BTF, and so bpf2go, carries the enums the loader reads. */
const enum ez_naive_counter ez_naive_counter_enum __attribute__((unused));
