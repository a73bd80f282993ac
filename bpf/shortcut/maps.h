/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maps of the socket shortcut. Sizes are defaults; the agent resizes them before load. */
#ifndef EZ_SHORTCUT_MAPS_H
#define EZ_SHORTCUT_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/counters.h"
#include "lib/errno.h"
#include "shortcut/shortcut.h"


/* Enrolled sockets by socket cookie. Redirect targets. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 131072);
	__type(key, __u64);
	__type(value, __u64);
} ez_sc_sockets SEC(".maps");

/*
 * Pairing records of connections being set up, by canonical connection key.
 * The three maps of handshakes in flight (pairs, aliases, SYN index) are
 * LRU: a SYN scan faster than max_entries per aging period would otherwise
 * fill them, and every handshake on the node would fall back until aging
 * (an outside packet switching acceleration off for others). With LRU a
 * new handshake always gets its entries by evicting the oldest (the scan's:
 * htab_lru_map_update_elem -> prealloc_lru_pop shrinks the LRU list instead
 * of failing). LRU maps are preallocated (no BPF_F_NO_PREALLOC): the memory
 * of max_entries is taken at load. Eviction of a record in flight only
 * sends its handshake to the kernel path: a client finds no record
 * (no_local_peer), a server finds none and stays out of the sockhash, a
 * waiting client settles KERNEL and leaves the sockhash at its next segment
 * (on_segment). Quirk: an evicted element is reused at once
 * (htab_lru_push_free, no RCU grace period), so a pointer from a lookup may
 * come to hold another key's record; the client checks client_cookie, the
 * server re-checks it after its decision (on_server_established).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ez_conn_key);
	__type(value, struct ez_pair);
} ez_sc_pairs SEC(".maps");

/* What proves each record (struct ez_pair_proof), by the record's key. LRU:
 * a proof lost to eviction only sends its handshake to the kernel path. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ez_conn_key);
	__type(value, struct ez_pair_proof);
} ez_sc_proofs SEC(".maps");

/* Client-side keys of handshakes NAT-ed in the server's namespace. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH); /* as ez_sc_pairs */
	__uint(max_entries, 16384);
	__type(key, struct ez_conn_key);
	__type(value, struct ez_alias);
} ez_sc_aliases SEC(".maps");

/* Records of handshakes in flight, by what a listener's SYN-ACK shows. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH); /* as ez_sc_pairs */
	__uint(max_entries, 16384);
	__type(key, struct ez_syn_index);
	__type(value, struct ez_alias);
} ez_sc_syn_index SEC(".maps");

/* Per-socket state; the kernel frees an entry with its socket. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ez_sock);
} ez_sc_socks SEC(".maps");

/* Agent control: index 0 = EZ_CTL_DRAINING (1 once uninstall began). Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EZ_CTL_MAX);
	__type(key, __u32);
	__type(value, __u32);
} ez_sc_control SEC(".maps");

static __always_inline bool draining(void)
{
	__u32 k = EZ_CTL_DRAINING;
	__u32 *v = bpf_map_lookup_elem(&ez_sc_control, &k);

	return v && *v;
}

/* Selection rules (not pinned: each agent start writes its own). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not the bound */
	__uint(max_entries, 1024);
	__type(key, __u32);		/* server port */
	__type(value, __u32);		/* enum ez_rule */
} ez_sc_port_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 1024);
	__type(key, struct ez_cidr_key);
	__type(value, __u32);		/* enum ez_rule; the longest prefix decides */
} ez_sc_cidr_rules SEC(".maps");

/* Selected cgroups (EZ_CFG_CGROUP_FILTER), by cgroup id. Pinned: a restart
 * keeps the selection until the new agent writes its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, struct ez_cgroup);
} ez_sc_cgroups SEC(".maps");

/* Adoption (shortcut/adopt.h): records by client cookie, written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct ez_adopt);
} ez_sc_adopts SEC(".maps");

/* Each end's cookie to its ez_sc_adopts record and role. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 32768);
	__type(key, __u64);
	__type(value, struct ez_adopt_ref);
} ez_sc_adopt_socks SEC(".maps");

/* cgroup ids where ez_sc_sockops is attached (the agent keeps it in sync with
 * its links): only their sockets get the callbacks adoption's tripwire needs. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u32);
} ez_sc_adopt_hooks SEC(".maps");

EZ_COUNTER_MAP(ez_sc_counters, EZ_C_MAX);
EZ_COUNTER_MAP(ez_sc_adopt_counters, EZ_A_MAX);

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
