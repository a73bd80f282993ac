/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters: a BPF_MAP_TYPE_PERCPU_ARRAY of __u64 indexed by an enum
 * (each program file defines its own). */
#ifndef EZ_LIB_COUNTERS_H
#define EZ_LIB_COUNTERS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

static __always_inline void ez_counter_add(void *map, __u32 c, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, &c);

	if (v)
		*v += n;
}

#endif
