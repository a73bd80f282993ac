// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Unit-test programs (internal/bpftest): tc programs, run with
 * BPF_PROG_TEST_RUN, that call the same inline helpers the shortcut and the
 * tracer use on inputs from a packet or a map and write what they return
 * to a map. Never attached.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "lib/parse.h"
#include "lib/bound.h"
#include "shortcut/shortcut.h"

/* The two maps and the flags key_selected reads, as shortcut.bpf.c defines
 * them (the tests fill them): only the helpers under test, no program and
 * no other map, come from the headers below. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
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

/* enum ez_cfg_flag bits, as shortcut.bpf.c declares them; set by the test. */
volatile const __u32 ez_cfg_flags = 0;

#include "shortcut/key.h"
#include "shortcut/select.h"
#include "shortcut/syn.h"
#include "tracer/flow.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* ez_parse through both readers, ez_tcp_flags_quick, and the egress program's parse_syn. */
struct test_parse_out {
	struct ez_flow skb;	/* ez_skb_read (a test run's packet is all linear data) */
	struct ez_flow kern;	/* bpf_probe_read_kernel, as the tracer reads */
	struct ez_conn_key syn_key;
	__s32 skb_ret;
	__s32 kern_ret;
	__u32 syn_ok;
	__u32 syn_ack;
	__u32 syn_payload;
	__s32 quick;		/* ez_tcp_flags_quick */
};

struct test_key_in {
	struct ez_sock_ends ends;
	__u32 server;
	__u64 netns_cookie;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct test_parse_out);
} test_parse_out SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct test_key_in);
} test_key_in SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ez_conn_key);
} test_key_out SEC(".maps");

/* The packet is an Ethernet frame: the network header is at 14. */
SEC("tc")
int test_parse(struct __sk_buff *skb)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, 14);
	struct ez_syn syn = {};
	struct test_parse_out *o;
	__u32 zero = 0;

	o = bpf_map_lookup_elem(&test_parse_out, &zero);
	if (!o)
		return 1;
	__builtin_memset(o, 0, sizeof(*o));
	o->skb_ret = ez_parse(&p, false, &o->skb);
	o->kern_ret = trc_parse(bpf_cast_to_kern_ctx(skb), TRC_L3_NET, &o->kern);
	o->quick = ez_tcp_flags_quick(skb, 14);
	o->syn_ok = o->skb_ret == 0 && parse_syn(&o->skb, &syn);
	o->syn_key = syn.key;
	o->syn_ack = syn.ack;
	o->syn_payload = syn.payload;
	return 0;
}

/* key_from_ends + the loopback netns rule, as key_from_sockops does. */
SEC("tc")
int test_key(struct __sk_buff *skb)
{
	struct ez_conn_key *k;
	struct test_key_in *in;
	__u32 zero = 0;

	in = bpf_map_lookup_elem(&test_key_in, &zero);
	k = bpf_map_lookup_elem(&test_key_out, &zero);
	if (!in || !k)
		return 1;
	__builtin_memset(k, 0, sizeof(*k));
	key_from_ends(k, &in->ends, in->server);
	key_set_netns(k, in->netns_cookie);
	return 0;
}

/* key_selected on the key in test_key_out: returns 1 when selected. */
SEC("tc")
int test_select(struct __sk_buff *skb)
{
	struct ez_conn_key *k;
	__u32 zero = 0;

	k = bpf_map_lookup_elem(&test_key_out, &zero);
	if (!k)
		return 2;
	return key_selected(k);
}

/* ez_unread_bound on the inputs in test_bound: writes the bound there. */
struct test_bound {
	__u32 override;
	__u32 userlocks;
	__s32 rcvbuf;
	__s32 rmem_max;
	__u32 kernel_bp;
	__u32 out;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct test_bound);
} test_bound_io SEC(".maps");

SEC("tc")
int test_unread_bound(struct __sk_buff *skb)
{
	struct test_bound *b;
	__u32 zero = 0;

	b = bpf_map_lookup_elem(&test_bound_io, &zero);
	if (!b)
		return 1;
	b->out = ez_unread_bound(b->override, b->userlocks, b->rcvbuf, b->rmem_max, b->kernel_bp);
	return 0;
}

/* Referenced so that BTF, and so bpf2go, carries the enums the tests use. */
const enum ez_flow_flag ez_flow_flag_enum __attribute__((unused));
const enum ez_cfg_flag ez_cfg_flag_enum __attribute__((unused));
const enum ez_rule ez_rule_enum __attribute__((unused));

/* Quirk: clang emits a struct only pointed to (here struct __sk_buff's sk
 * and flow_keys) as a BTF FWD, and the order of several FWDs varied with
 * the checkout's path, so `make check-generated` failed in another clone.
 * Defined in full, they have their place. */
const struct bpf_sock ez_test_bpf_sock __attribute__((unused));
