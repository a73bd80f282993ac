/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The Service load balancer's maps and the helpers every program of the
 * family uses (counting, a random backend of a frontend): one definition,
 * included by services.bpf.c and by each header that needs them, so every
 * header compiles alone.
 */
#ifndef EZ_SERVICES_MAPS_H
#define EZ_SERVICES_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/counters.h"
#include "services/services.h"

#define EZ_IPPROTO_TCP 6
#define EZ_IPPROTO_UDP 17

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

EZ_COUNTER_MAP(ez_svc_counters, EZ_SVC_C_MAX);

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

static __always_inline void count(__u32 c)
{
	ez_counter_add(&ez_svc_counters, c, 1);
}

/* A random backend of svc: one it carries (EZ_SVC_INLINE), else by slot;
 * two tries when an update races the lookups. */
static __always_inline struct ez_svc_backend *choose_random(const struct ez_svc *svc, __u32 *backend_id)
{
	__u32 n = svc->count;

	if (n > 0 && n <= EZ_SVC_INLINE) {
		__u32 i = n == 1 ? 0 : bpf_get_prandom_u32() % n;

		if (i >= EZ_SVC_INLINE)
			return NULL;
		*backend_id = svc->ids[i];
		return (struct ez_svc_backend *)&svc->be[i];
	}
	for (int i = 0; i < 2; i++) {
		struct ez_svc_slot_key sk = { .id = svc->id };
		struct ez_svc_backend *be;
		__u32 *id;

		if (n == 0)
			return NULL;
		sk.slot = bpf_get_prandom_u32() % n;
		id = bpf_map_lookup_elem(&ez_svc_slots, &sk);
		if (id) {
			be = bpf_map_lookup_elem(&ez_svc_backends, id);
			if (be) {
				*backend_id = *id;
				return be;
			}
		}
		count(EZ_SVC_C_BACKEND_MISS);
	}
	return NULL;
}

#endif
