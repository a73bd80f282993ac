/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters: a BPF_MAP_TYPE_PERCPU_ARRAY of __u64 indexed by an enum. */
#ifndef EZ_LIB_COUNTERS_H
#define EZ_LIB_COUNTERS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* Declares the counter map name with n slots. */
#define EZ_COUNTER_MAP(name, n)					\
	struct {						\
		__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);	\
		__uint(max_entries, n);				\
		__type(key, __u32);				\
		__type(value, __u64);				\
	} name SEC(".maps")

static __always_inline void ez_counter_add(void *map, __u32 c, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, &c);

	if (v)
		*v += n;
}

#endif
