// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Service load balancing at the socket (ClusterIP): cgroup sock_addr
 * programs translate a frontend (ClusterIP:port, TCP or UDP) to one of its
 * backends before the kernel routes anything, so no packet carries the
 * ClusterIP and nothing needs DNAT or conntrack.
 *
 * connect4/6: TCP and connected UDP, backend chosen at random per socket
 * (with sessionAffinity ClientIP: per client network namespace, while used
 * within the timeout).
 * sendmsg4/6: unconnected UDP, one backend per socket and frontend, kept
 * while it stays one of the frontend's backends. recvmsg4/6 show replies as
 * coming from the frontend; getpeername4/6 show the frontend as the peer.
 * The reverse translations live in the socket's sk_storage: exact per
 * socket and freed with it.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lib/errno.h"
#include "services/maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that BTF, and so bpf2go, carries the enum Go names. */
const enum ez_svc_counter ez_svc_counter_enum __attribute__((unused));
const enum ez_svc_proxy_flag ez_svc_proxy_flag_enum __attribute__((unused));
const enum ez_svc_proxy_limit ez_svc_proxy_limit_enum __attribute__((unused));

#include "services/destroy.h"

/* The socket address of ctx (user_ip4/6, user_port) as 16 bytes and a port. */
static __always_inline void ctx_addr(struct bpf_sock_addr *ctx, int v6, __u8 addr[16], __u16 *port)
{
	if (v6) {
		__u32 w[4] = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] };

		__builtin_memcpy(addr, w, 16);
	} else {
		__u32 ip = ctx->user_ip4;

		__builtin_memset(addr, 0, 10);
		addr[10] = 0xff;
		addr[11] = 0xff;
		__builtin_memcpy(addr + 12, &ip, 4);
	}
	*port = bpf_ntohs((__u16)ctx->user_port);
}

static __always_inline int is_v4mapped(const __u8 a[16])
{
	__u64 hi;
	__u32 mid;

	__builtin_memcpy(&hi, a, 8);
	__builtin_memcpy(&mid, a + 8, 4);
	return hi == 0 && mid == bpf_htonl(0xffff);
}

/* Writes addr:port to ctx; an IPv6 address to an IPv4 socket fails. */
static __always_inline int set_ctx_addr(struct bpf_sock_addr *ctx, int v6, const __u8 addr[16], __u16 port)
{
	if (v6) {
		__u32 w[4];

		__builtin_memcpy(w, addr, 16);
		ctx->user_ip6[0] = w[0];
		ctx->user_ip6[1] = w[1];
		ctx->user_ip6[2] = w[2];
		ctx->user_ip6[3] = w[3];
	} else {
		__u32 ip;

		if (!is_v4mapped(addr))
			return -1;
		__builtin_memcpy(&ip, addr + 12, 4);
		ctx->user_ip4 = ip;
	}
	ctx->user_port = bpf_htons(port);
	return 0;
}

static __always_inline int same_addr(const __u8 a[16], const __u8 b[16])
{
	__u64 a0, a1, b0, b1;

	__builtin_memcpy(&a0, a, 8);
	__builtin_memcpy(&a1, a + 8, 8);
	__builtin_memcpy(&b0, b, 8);
	__builtin_memcpy(&b1, b + 8, 8);
	return a0 == b0 && a1 == b1;
}

/* The frontend ctx points at, for TCP and UDP sockets only. */
static __always_inline struct ez_svc *frontend(struct bpf_sock_addr *ctx, int v6, struct ez_svc_key *k)
{
	__u32 proto = ctx->protocol;

	if (proto != EZ_IPPROTO_TCP && proto != EZ_IPPROTO_UDP)
		return NULL;
	__builtin_memset(k, 0, sizeof(*k));
	ctx_addr(ctx, v6, k->addr, &k->port);
	k->proto = proto;
	return bpf_map_lookup_elem(&ez_svc_frontends, k);
}

/* The backend for a new connection or socket: with sessionAffinity the
 * client's earlier one while it is recent and still one of svc's, else a
 * random one (remembered for the client). */
static __always_inline struct ez_svc_backend *choose(struct bpf_sock_addr *ctx, const struct ez_svc *svc, __u32 *backend_id)
{
	struct ez_svc_affinity_key ak = { .id = svc->id };
	struct ez_svc_backend *be;
	struct ez_svc_affinity *a;
	__u32 timeout = svc->affinity;
	__u64 now;

	if (timeout == 0)
		return choose_random(svc, backend_id);
	ak.netns = bpf_get_netns_cookie(ctx);
	now = bpf_ktime_get_ns();
	a = bpf_map_lookup_elem(&ez_svc_affinities, &ak);
	if (a && now - a->last_ns <= (__u64)timeout * 1000000000ULL) {
		struct ez_svc_member_key mk = { .id = svc->id, .backend = a->backend };

		if (bpf_map_lookup_elem(&ez_svc_members, &mk)) {
			be = bpf_map_lookup_elem(&ez_svc_backends, &mk.backend);
			if (be) {
				*backend_id = mk.backend;
				a->last_ns = now;
				count(EZ_SVC_C_AFFINITY_HIT);
				return be;
			}
		}
	}
	be = choose_random(svc, backend_id);
	if (be) {
		struct ez_svc_affinity v = { .last_ns = now, .backend = *backend_id };

		bpf_map_update_elem(&ez_svc_affinities, &ak, &v, BPF_ANY);
	}
	return be;
}

/* The socket's entry for frontend k, or the one to replace. */
static __always_inline struct ez_svc_rev *rev_for(struct ez_svc_sock *s, const struct ez_svc_key *k, int *found)
{
	for (int i = 0; i < EZ_SVC_SOCK_REVS; i++) {
		struct ez_svc_rev *r = &s->rev[i];

		if (r->id != 0 && r->vip_port == k->port && same_addr(r->vip, k->addr)) {
			*found = 1;
			return r;
		}
	}
	*found = 0;
	__u32 i = s->next % EZ_SVC_SOCK_REVS;

	s->next = i + 1;
	return &s->rev[i & (EZ_SVC_SOCK_REVS - 1)];
}

/* The socket's entry whose backend is addr:port. */
static __always_inline struct ez_svc_rev *rev_by_backend(struct ez_svc_sock *s, const __u8 addr[16], __u16 port)
{
	for (int i = 0; i < EZ_SVC_SOCK_REVS; i++) {
		struct ez_svc_rev *r = &s->rev[i];

		if (r->id != 0 && r->backend_port == port && same_addr(r->backend, addr))
			return r;
	}
	return NULL;
}

static __always_inline void fill_rev(struct ez_svc_rev *r, const struct ez_svc_key *k, const struct ez_svc *svc,
				     const struct ez_svc_backend *be, __u32 backend_id)
{
	__builtin_memcpy(r->vip, k->addr, 16);
	__builtin_memcpy(r->backend, be->addr, 16);
	r->vip_port = k->port;
	r->backend_port = be->port;
	r->id = svc->id;
	r->backend_id = backend_id;
}

/* No backends: the errno kube-proxy's REJECT (icmp-port-unreachable) gives a
 * connect. Returning 0 alone would give EPERM. */
static __always_inline int refuse(void)
{
	count(EZ_SVC_C_NO_BACKEND);
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

/* Whether the connecting task's pod is left to its proxy and the task is
 * not the proxy. The task's cgroup is a container's (or the pod's own):
 * its ancestors at the levels pods are at are looked up. uid is the real
 * uid in the initial user namespace, as iptables' owner match sees it
 * for pods without user namespaces. */
static __always_inline int left_to_proxy(void)
{
	struct ez_svc_proxy_span *lv;
	__u32 zero = 0;

	lv = bpf_map_lookup_elem(&ez_svc_proxy_levels, &zero);
	if (!lv || lv->max == 0)
		return 0;
	for (__u32 i = 0; i < EZ_SVC_PROXY_SPAN; i++) {
		__u32 level = lv->min + i;
		struct ez_svc_proxy *p;
		__u64 id;

		if (level > lv->max)
			break;
		id = bpf_get_current_ancestor_cgroup_id(level);
		if (!id)
			break; /* the task is above this level */
		p = bpf_map_lookup_elem(&ez_svc_proxied, &id);
		if (!p)
			continue;
		if ((p->flags & EZ_SVC_PROXY_UID) && (__u32)bpf_get_current_uid_gid() == p->uid)
			return 0;
		return 1;
	}
	return 0;
}

static __always_inline int do_connect(struct bpf_sock_addr *ctx, int v6)
{
	struct ez_svc_backend *be;
	struct ez_svc_sock *s;
	struct ez_svc_rev *r;
	struct ez_svc_key k;
	struct ez_svc *svc;
	__u32 backend_id;
	int found;

	svc = frontend(ctx, v6, &k);
	if (!svc)
		return 1;
	/* TCP only: UDP has no proxy to learn its destination, and is
	 * translated for every pod. */
	if (k.proto == EZ_IPPROTO_TCP && left_to_proxy()) {
		count(EZ_SVC_C_LEFT_TO_PROXY);
		return 1;
	}
	be = choose(ctx, svc, &backend_id);
	if (!be)
		return refuse();
	if (set_ctx_addr(ctx, v6, be->addr, be->port))
		return 1; /* family mismatch, userspace prevents it */
	count(k.proto == EZ_IPPROTO_TCP ? EZ_SVC_C_TCP_CONNECT : EZ_SVC_C_UDP_CONNECT);
	s = bpf_sk_storage_get(&ez_svc_socks, ctx->sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);
	if (!s) {
		count(EZ_SVC_C_NO_STORAGE);
		return 1;
	}
	r = rev_for(s, &k, &found);
	fill_rev(r, &k, svc, be, backend_id);
	return 1;
}

static __always_inline int do_sendmsg(struct bpf_sock_addr *ctx, int v6)
{
	struct ez_svc_backend *be = NULL;
	struct ez_svc_sock *s;
	struct ez_svc_rev *r;
	struct ez_svc_key k;
	struct ez_svc *svc;
	__u32 backend_id;
	int found;

	svc = frontend(ctx, v6, &k);
	if (!svc)
		return 1;
	s = bpf_sk_storage_get(&ez_svc_socks, ctx->sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);
	if (!s) {
		count(EZ_SVC_C_NO_STORAGE);
		be = choose(ctx, svc, &backend_id);
		if (!be)
			return refuse();
		set_ctx_addr(ctx, v6, be->addr, be->port);
		count(EZ_SVC_C_UDP_SEND);
		return 1;
	}
	r = rev_for(s, &k, &found);
	if (found && r->id == svc->id) {
		/* Keep the earlier backend while it is still one of svc's. */
		struct ez_svc_member_key mk = { .id = svc->id, .backend = r->backend_id };

		if (bpf_map_lookup_elem(&ez_svc_members, &mk)) {
			be = bpf_map_lookup_elem(&ez_svc_backends, &r->backend_id);
			if (be && (be->port != r->backend_port || !same_addr(be->addr, r->backend)))
				be = NULL;
		}
		if (be)
			backend_id = r->backend_id;
		else
			count(EZ_SVC_C_UDP_REPICK);
	}
	if (!be) {
		be = choose(ctx, svc, &backend_id);
		if (!be) {
			r->id = 0;
			return refuse();
		}
		fill_rev(r, &k, svc, be, backend_id);
	}
	if (set_ctx_addr(ctx, v6, be->addr, be->port))
		return 1;
	count(EZ_SVC_C_UDP_SEND);
	return 1;
}

/* recvmsg (UDP source address) and getpeername: backend -> frontend. */
static __always_inline int do_reverse(struct bpf_sock_addr *ctx, int v6, __u32 counter)
{
	struct ez_svc_sock *s;
	struct ez_svc_rev *r;
	__u8 addr[16];
	__u16 port;

	s = bpf_sk_storage_get(&ez_svc_socks, ctx->sk, NULL, 0);
	if (!s)
		return 1;
	ctx_addr(ctx, v6, addr, &port);
	r = rev_by_backend(s, addr, port);
	if (!r)
		return 1;
	if (set_ctx_addr(ctx, v6, r->vip, r->vip_port) == 0)
		count(counter);
	return 1;
}

SEC("cgroup/connect4")
int ez_svc_connect4(struct bpf_sock_addr *ctx) { return do_connect(ctx, 0); }

SEC("cgroup/connect6")
int ez_svc_connect6(struct bpf_sock_addr *ctx) { return do_connect(ctx, 1); }

SEC("cgroup/sendmsg4")
int ez_svc_sendmsg4(struct bpf_sock_addr *ctx) { return do_sendmsg(ctx, 0); }

SEC("cgroup/sendmsg6")
int ez_svc_sendmsg6(struct bpf_sock_addr *ctx) { return do_sendmsg(ctx, 1); }

SEC("cgroup/recvmsg4")
int ez_svc_recvmsg4(struct bpf_sock_addr *ctx) { return do_reverse(ctx, 0, EZ_SVC_C_RECV_REVERSED); }

SEC("cgroup/recvmsg6")
int ez_svc_recvmsg6(struct bpf_sock_addr *ctx) { return do_reverse(ctx, 1, EZ_SVC_C_RECV_REVERSED); }

SEC("cgroup/getpeername4")
int ez_svc_getpeername4(struct bpf_sock_addr *ctx) { return do_reverse(ctx, 0, EZ_SVC_C_PEER_REVERSED); }

SEC("cgroup/getpeername6")
int ez_svc_getpeername6(struct bpf_sock_addr *ctx) { return do_reverse(ctx, 1, EZ_SVC_C_PEER_REVERSED); }

#include "services/origdst.h"
#include "services/nodeport.h"
