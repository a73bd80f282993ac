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
#include "services/services.h"

/* Sizes are set from userspace before load. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct ez_svc_key);
	__type(value, struct ez_svc);
} ez_svc_frontends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 131072);
	__type(key, struct ez_svc_slot_key);
	__type(value, __u32);
} ez_svc_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 131072);
	__type(key, struct ez_svc_member_key);
	__type(value, __u32);
} ez_svc_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct ez_svc_backend);
} ez_svc_backends SEC(".maps");

/* sessionAffinity entries: LRU, as they expire by time anyway. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ez_svc_affinity_key);
	__type(value, struct ez_svc_affinity);
} ez_svc_affinities SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ez_svc_sock);
} ez_svc_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_SVC_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ez_svc_counters SEC(".maps");

/* Pods left to their proxy, by pod cgroup id (bpf/services/services.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct ez_svc_proxy);
} ez_svc_proxied SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ez_svc_proxy_span);
} ez_svc_proxy_levels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, struct ez_svc_gone_key);
	__type(value, __u32);
} ez_svc_gone SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct ez_svc_orig_key);
	__type(value, struct ez_svc_orig);
} ez_svc_origdst SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, struct ez_svc_np_key);
	__type(value, struct ez_svc_np);
} ez_svc_nodeports SEC(".maps");

/* The node's addresses NodePorts answer on (IPv4 v4-mapped), written by
 * userspace from the NodePort devices' addresses. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 256);
	__type(key, struct ez_svc_backend);	/* addr, port 0 */
	__type(value, __u32);
} ez_svc_node_addrs SEC(".maps");

/* Helpers (headers): they use the maps above. */
#include "services/backend.h"

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

/* Programs; their helpers are in services/destroy.h. */

SEC("iter/tcp")
int ez_svc_destroy_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct tcp_sock *tp;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);	/* full sockets only: not request or timewait */
	if (!tp || !translated_to_gone((struct sock *)tp, EZ_SVC_GONE_TCP))
		return 0;
	if (!bpf_sock_destroy(skc))
		count(EZ_SVC_C_DESTROYED_TCP);
	return 0;
}

SEC("iter/udp")
int ez_svc_destroy_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *up = ctx->udp_sk;
	struct sock *sk = (struct sock *)up;

	if (!sk || sk->__sk_common.skc_state != 1 /* TCP_ESTABLISHED: connected */)
		return 0;
	if (!translated_to_gone(sk, EZ_SVC_GONE_UDP))
		return 0;
	if (!bpf_sock_destroy(&sk->__sk_common))
		count(EZ_SVC_C_DESTROYED_UDP);
	return 0;
}

SEC("iter/tcp")
int ez_svc_gone_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct tcp_sock *tp;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp || !translated_to_gone((struct sock *)tp, EZ_SVC_GONE_TCP))
		return 0;
	gone_sock_write(ctx->meta->seq, (struct sock *)tp, 6 /* IPPROTO_TCP */);
	return 0;
}

SEC("iter/udp")
int ez_svc_gone_udp(struct bpf_iter__udp *ctx)
{
	struct udp_sock *up = ctx->udp_sk;
	struct sock *sk = (struct sock *)up;

	if (!sk || sk->__sk_common.skc_state != 1 /* TCP_ESTABLISHED: connected */)
		return 0;
	if (!translated_to_gone(sk, EZ_SVC_GONE_UDP))
		return 0;
	gone_sock_write(ctx->meta->seq, sk, 17 /* IPPROTO_UDP */);
	return 0;
}

/* Programs; their helpers are in services/origdst.h. */

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

/* Programs; their helpers are in services/nodeport.h. */

SEC("tc")
int ez_svc_nodeport(struct __sk_buff *skb)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, EZ_NP_ETH_HLEN);
	struct bpf_ct_opts opts = {};
	struct bpf_sock_tuple tuple = {};
	struct ez_svc_backend node = {};
	struct ez_svc_np_key nk = {};
	union nf_inet_addr nat = {};
	struct nf_conn___init *nct;
	struct ez_svc_backend *be;
	struct nf_conn *ct;
	struct ez_svc_np *np;
	struct ez_flow f = {};
	__u32 tsz, backend_id;

	if (skb->pkt_type != 0 /* PACKET_HOST */ || ez_parse(&p, false, &f) || !(f.flags & EZ_FLOW_PORTS))
		return TCX_NEXT;
	if (f.proto != EZ_IPPROTO_TCP && f.proto != EZ_IPPROTO_UDP)
		return TCX_NEXT;
	nk.port = f.dport;
	nk.proto = f.proto;
	nk.family = f.family;
	np = bpf_map_lookup_elem(&ez_svc_nodeports, &nk);
	if (!np)
		return TCX_NEXT;
	np_addr16(&f, f.daddr, node.addr);
	if (!bpf_map_lookup_elem(&ez_svc_node_addrs, &node))
		return TCX_NEXT;
	tsz = ez_ct_tuple(&f, &tuple);
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f.proto;
	ct = bpf_skb_ct_lookup(skb, &tuple, tsz, &opts, EZ_CT_OPTS_SZ);
	if (ct) {
		/* A SYN on the tuple of a closed flow (TIME_WAIT, CLOSE: a client
		 * reusing its port) reopens it in conntrack, which kills the
		 * entry and makes a new one without our NAT. So the old entry is
		 * expired now (timeout 0: the next lookup reaps it) and the flow
		 * set up anew. Any other known flow: conntrack NATs it. */
		__u8 state = ct->proto.tcp.state;
		int reopen = f.proto == EZ_IPPROTO_TCP && (f.tcp_flags & (EZ_TCP_SYN | EZ_TCP_ACK | EZ_TCP_RST)) == EZ_TCP_SYN &&
			     (state == TCP_CONNTRACK_TIME_WAIT || state == TCP_CONNTRACK_CLOSE);

		if (reopen)
			bpf_ct_change_timeout(ct, 0);
		bpf_ct_release(ct);
		if (!reopen)
			return TCX_NEXT;
		__builtin_memset(&opts, 0, sizeof(opts));
		opts.netns_id = BPF_F_CURRENT_NETNS;
		opts.l4proto = f.proto;
		ct = bpf_skb_ct_lookup(skb, &tuple, tsz, &opts, EZ_CT_OPTS_SZ);
		if (ct) {	/* still there: leave it to the kernel path */
			bpf_ct_release(ct);
			count(EZ_SVC_C_NP_CT_FAILED);
			return TCX_NEXT;
		}
		count(EZ_SVC_C_NP_REOPENED);
	}
	if (f.proto == EZ_IPPROTO_TCP && (f.tcp_flags & (EZ_TCP_SYN | EZ_TCP_ACK | EZ_TCP_RST)) != EZ_TCP_SYN) {
		count(EZ_SVC_C_NP_NOT_NEW);
		return TCX_NEXT;
	}
	if (!np->svc.count) {
		count(EZ_SVC_C_NP_NO_BACKEND);
		return TCX_NEXT;
	}
	be = choose_random(&np->svc, &backend_id);
	if (!be) {
		count(EZ_SVC_C_NP_NO_BACKEND);
		return TCX_NEXT;
	}
	__builtin_memset(&opts, 0, sizeof(opts));
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f.proto;
	nct = bpf_skb_ct_alloc(skb, &tuple, tsz, &opts, EZ_CT_OPTS_SZ);
	if (!nct) {
		count(EZ_SVC_C_NP_CT_FAILED);
		return TCX_NEXT;
	}
	np_nat_addr(&f, be->addr, &nat);
	if (bpf_ct_set_nat_info(nct, &nat, be->port, NF_NAT_MANIP_DST))
		goto failed;
	/* Source: Cluster masquerades to the node address the client used;
	 * Local keeps the client's address. Both let nf_nat choose another
	 * source port when the reply tuple is taken (another flow from the
	 * same client port to the same backend, e.g. in TIME_WAIT), as the
	 * kernel path's null binding does: without it the insert fails. */
	if (np->flags & EZ_SVC_NP_LOCAL)
		np_addr16(&f, f.saddr, node.addr);
	np_nat_addr(&f, node.addr, &nat);
	if (bpf_ct_set_nat_info(nct, &nat, -1, NF_NAT_MANIP_SRC))
		goto failed;
	bpf_ct_set_timeout(nct, EZ_NP_CT_TIMEOUT_MS);
	ct = bpf_ct_insert_entry(nct);
	if (!ct) {
		count(EZ_SVC_C_NP_CT_FAILED);	/* a racing packet inserted it: the kernel NATs by that */
		return TCX_NEXT;
	}
	bpf_ct_release(ct);
	count(EZ_SVC_C_NP_NEW);
	return TCX_NEXT;
failed:
	/* Quirk: an allocated entry cannot be released, only inserted
	 * (bpf_ct_release takes nf_conn, not nf_conn___init). It goes in for
	 * 1 s: this packet takes the kernel path un-NATed, a retransmission
	 * after that tries again. */
	bpf_ct_set_timeout(nct, 1000);
	ct = bpf_ct_insert_entry(nct);
	if (ct)
		bpf_ct_release(ct);
	count(EZ_SVC_C_NP_CT_FAILED);
	return TCX_NEXT;
}

/* Referenced so that BTF, and so bpf2go, carries the types of the helper
 * headers Go reads. */
const enum ez_svc_gone_flag ez_svc_gone_flag_enum __attribute__((unused));
const struct ez_svc_gone_sock ez_svc_gone_sock_type __attribute__((unused));
const enum ez_svc_np_flag ez_svc_np_flag_enum __attribute__((unused));
