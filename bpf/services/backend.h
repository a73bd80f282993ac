/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The helpers every program of the Service load balancer uses (counting, a
 * random backend of a frontend), over the maps services.bpf.c defines.
 */
#ifndef EZ_SERVICES_BACKEND_H
#define EZ_SERVICES_BACKEND_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/counters.h"
#include "services/services.h"

#define EZ_IPPROTO_TCP 6
#define EZ_IPPROTO_UDP 17

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
