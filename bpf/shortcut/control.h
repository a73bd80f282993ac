/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Counting, draining and record deletion over the maps shortcut.bpf.c defines. */
#ifndef EZ_SHORTCUT_CONTROL_H
#define EZ_SHORTCUT_CONTROL_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/counters.h"
#include "lib/errno.h"
#include "shortcut/shortcut.h"

static __always_inline bool draining(void)
{
	__u32 k = EZ_CTL_DRAINING;
	__u32 *v = bpf_map_lookup_elem(&ez_sc_control, &k);

	return v && *v;
}

static __always_inline void count_add(__u32 c, __u64 n)
{
	ez_counter_add(&ez_sc_counters, c, n);
}

static __always_inline void count(__u32 c)
{
	count_add(c, 1);
}

#define EZ_ENOENT 2

/*
 * Deletes a pairing or unread record whose last user is done with it. A
 * failure other than a missing key leaves the record behind for good, so
 * it is counted. Quirk: a hash map's bucket lock is an rqspinlock (6.15+),
 * and taking it can fail (-ETIMEDOUT after 250 ms, -EDEADLK), for example
 * while the vCPU holding it is preempted by the hypervisor.
 */
static __always_inline void delete_record(void *map, const void *key)
{
	long err = bpf_map_delete_elem(map, key);

	if (err && err != -EZ_ENOENT)
		count(EZ_C_DELETE_FAILED);
}

static __always_inline void adopt_count(__u32 c)
{
	ez_counter_add(&ez_sc_adopt_counters, c, 1);
}

/* Maps an insert error to the fallback reason it is counted under. */
static __always_inline void count_insert_error(long err)
{
	if (err == -EBUSY)
		count(EZ_C_FB_EBUSY);
	else if (err == -E2BIG || err == -ENOMEM || err == -ENOSPC)
		count(EZ_C_FB_MAP_FULL);
	else if (err == -EEXIST)
		count(EZ_C_FB_AMBIGUOUS);
	else
		count(EZ_C_FB_OTHER);
}

#endif
