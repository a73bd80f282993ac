// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Bridge bypass. tcx ingress of each pod's host-side veth (packets leaving
 * the pod): an established TCP or UDP flow to another local pod, whose
 * conntrack entry netfilter already confirmed without NAT, is redirected
 * straight into the destination pod's eth0, skipping the bridge,
 * br_netfilter and iptables (frames the node would route are rewritten as
 * routing would); one to another node's pod goes straight to the uplink or
 * VXLAN device the FIB lookup names. tcx ingress of those devices: packets
 * from other nodes to a local pod go straight into it. Everything else
 * continues on the kernel path (TCX_NEXT) with its reason counted. Nothing
 * is dropped.
 *
 * A direction of a flow is bypassed only after the kernel path sent one of
 * its packets out the device the bypass would send it to (ez_bypass_admit,
 * tcx egress of pod veths and uplinks):
 * it passed FORWARD and POSTROUTING. Conntrack's own state is not enough:
 * it is updated at PREROUTING, before FORWARD may drop the packet (a UDP
 * reply dropped by FORWARD still sets SEEN_REPLY), and an entry picked up
 * mid-stream from one direction is ESTABLISHED for both.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "lib/counters.h"
#include "lib/parse.h"
#include "lib/ct.h"
#include "bypass/bypass.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that BTF, and so bpf2go, carries the enum Go names. */
const enum ez_bp_counter ez_bp_counter_enum __attribute__((unused));
const enum ez_bp_dev_kind ez_bp_dev_kind_enum __attribute__((unused));
const enum ez_bp_flow_kind ez_bp_flow_kind_enum __attribute__((unused));


/* Local pods by address, written by userspace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, struct ez_bp_ep_key);
	__type(value, struct ez_bp_endpoint);
} ez_bp_endpoints SEC(".maps");

/* The devices the bypass is attached to, by ifindex, written by userspace:
 * pod veths (with their bridge) and uplinks. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct ez_bp_device);
} ez_bp_devices SEC(".maps");

/* The switch (struct ez_bp_ctl), written from userspace. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ez_bp_ctl);
} ez_bp_switch SEC(".maps");

/*
 * The flow cache: a flow direction's checks (endpoint or FIB route, source,
 * conntrack admission) made by one packet stand for the next packets of
 * the direction for ez_bp_recheck_ns, unless an endpoint or device changes,
 * or the node's links, addresses, routes, rules or neighbours, meanwhile
 * (userspace bumps ez_bp_flows_gen). Per CPU and
 * direct-mapped: a slot is written only by the program running on its CPU,
 * and tc programs do not nest on a CPU (they run with bottom halves off),
 * so a slot is never read half-written. A flow whose slot another flow took
 * is checked in full again: slower, never on the wrong path. Not pinned:
 * every load starts empty.
 */
#define EZ_BP_FLOW_SLOTS 1024

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_BP_FLOW_SLOTS);
	__type(key, __u32);
	__type(value, struct ez_bp_flow);
} ez_bp_flows SEC(".maps");

/* The generation the cached checks must carry (one __u32), bumped by
 * userspace after every change of ez_bp_endpoints or ez_bp_devices
 * (SetEndpoint, DeleteEndpoint, SetBridge, Detach) and on every rtnetlink
 * notification of the node's links, addresses, routes, rules and
 * neighbours (routing.go). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} ez_bp_flows_gen SEC(".maps");

/* How long cached checks stand (ns); 0: every packet is checked in full
 * (--bypass-recheck). Set before load, as is the slot hash's seed. */
volatile const __u64 ez_bp_recheck_ns = 0;
volatile const __u32 ez_bp_flows_seed = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_BP_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ez_bp_counters SEC(".maps");

/*
 * Conntrack timeouts (ms) the bypass refreshes established entries to, set
 * before load from the node netns's sysctls (nf_conntrack_tcp_timeout_established,
 * nf_conntrack_udp_timeout_stream). Bypassed packets skip conntrack, which
 * would otherwise refresh the entry on every packet.
 */
volatile const __u32 ez_bp_tcp_timeout_ms = 0;
volatile const __u32 ez_bp_udp_timeout_ms = 0;

/* 1: UDP stays on the kernel path (--bypass-udp=false); set before load. */
volatile const __u32 ez_bp_no_udp = 0;

/* 1: IPv6 stays on the kernel path (--bypass-ipv6=false); set before load. */
volatile const __u32 ez_bp_no_ipv6 = 0;

/*
 * Conntrack mark bits recording admitted directions, [0] original, [1]
 * reply; set before load. In the entry itself, so a deleted entry's
 * admissions go with it. nf_conn.mark is the one field BPF may write.
 */
volatile const __u32 ez_bp_admit_mark[2] = {};

/*
 * The refresh timeouts in jiffies, learnt from the first refresh (ct->timeout is
 * in jiffies; HZ is not known to the program): index 0 TCP, 1 UDP.
 */
__u32 ez_bp_timeout_jiffies[2];

#define EZ_ETH_HLEN 14
#define EZ_BP_MTU_OK 0 /* BPF_MTU_CHG_RET_SUCCESS */

static __always_inline void count_add(__u32 c, __u64 n)
{
	ez_counter_add(&ez_bp_counters, c, n);
}

/* Every non-bypassed packet goes on: TCX_NEXT runs the programs attached
 * after this one, or passes the packet when there are none (TCX_PASS would
 * skip them). */
static __always_inline int fallback(__u32 reason)
{
	count_add(reason, 1);
	return TCX_NEXT;
}

static __always_inline bool mac_eq(const __u8 *a, const __u8 *b)
{
	/* MACs are 2-aligned (struct ethhdr on the stack is not 4-aligned). */
	const __u16 *x = (const __u16 *)a, *y = (const __u16 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2];
}

static __always_inline bool ipv6_ext(__u8 nh)
{
	/* hop-by-hop, routing, destination options, AH, mobility, HIP, shim6 */
	return nh == 0 || nh == 43 || nh == 60 || nh == 51 || nh == 135 || nh == 139 || nh == 140;
}

/*
 * Keeps an established entry alive while its packets skip conntrack: when
 * less than 7/8 of the timeout is left (so at most once per timeout/8 per
 * flow: 15 s for UDP streams, hours for TCP), it is set to the timeout
 * conntrack itself would set. The first refresh learns the timeout in
 * jiffies from the entry it just wrote.
 */
static __always_inline void refresh(struct nf_conn *ct, __u32 idx, __u32 timeout_ms)
{
	__u32 *learnt = &ez_bp_timeout_jiffies[idx & 1];
	__u32 period = *learnt;
	__u32 now = (__u32)bpf_jiffies64();
	__s32 left = (__s32)(ct->timeout - now);

	if (!timeout_ms)
		return;
	if (period && left > (__s32)(period - period / 8))
		return;
	/* -EPERM with IPS_FIXED_TIMEOUT, -ETIME when dying: left alone. */
	if (bpf_ct_change_timeout(ct, timeout_ms))
		return;
	if (!period)
		*learnt = *(volatile __u32 *)&ct->timeout - now;
	count_add(EZ_BP_C_CT_REFRESHES, 1);
}

static __always_inline int mac_store(struct __sk_buff *skb, const __u8 *dst, const __u8 *src)
{
	__u8 macs[12];

	__builtin_memcpy(macs, dst, 6);
	__builtin_memcpy(macs + 6, src, 6);
	return bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) ? -1 : 0;
}

/*
 * TTL or hop limit - 1, as forwarding does (IPv4: header checksum updated,
 * which leaves the header's sum and so CHECKSUM_COMPLETE as they were;
 * IPv6: CHECKSUM_COMPLETE updated). A failure before any byte is written
 * leaves the frame intact; the writes are of fixed, checked offsets.
 */
static __always_inline int ttl_decrement(struct __sk_buff *skb, const struct ez_flow *f)
{
	if (f->family == 4) {
		__u16 old, new;

		if (ez_skb_read(skb, EZ_ETH_HLEN + 8, &old, 2))
			return -1;
		new = old;
		((__u8 *)&new)[0] -= 1;
		if (bpf_l3_csum_replace(skb, EZ_ETH_HLEN + 10, old, new, 2))
			return -1;
		return bpf_skb_store_bytes(skb, EZ_ETH_HLEN + 8, &new, 2, 0) ? -1 : 0;
	}
	{
		__u8 hl;

		if (ez_skb_read(skb, EZ_ETH_HLEN + 7, &hl, 1))
			return -1;
		hl -= 1;
		return bpf_skb_store_bytes(skb, EZ_ETH_HLEN + 7, &hl, 1, BPF_F_RECOMPUTE_CSUM) ? -1 : 0;
	}
}

/* 0 when the packet may be forwarded by the bypass as routing would: TTL
 * above 1 (else the node answers ICMP time exceeded) and, IPv4, no options
 * (the forward path processes them). Else the fallback reason. */
static __always_inline __u32 routable(struct __sk_buff *skb, const struct ez_flow *f)
{
	__u8 ttl;

	if (f->family == 4 && f->l4off != 20)
		return EZ_BP_C_FB_IP_OPTIONS;
	if (ez_skb_read(skb, EZ_ETH_HLEN + (f->family == 4 ? 8 : 7), &ttl, 1))
		return EZ_BP_C_FB_OTHER;
	if (ttl <= 1)
		return EZ_BP_C_FB_TTL;
	return 0;
}

/*
 * The network-layer length of each packet the egress device will send, as
 * the forward path's MTU check sees it: the packet's, or for a GSO packet
 * its segments' (headers + gso_size, skb_gso_network_seglen). 0: unknown.
 */
static __always_inline __u32 l3_seg_len(struct __sk_buff *skb, const struct ez_flow *f)
{
	__u32 gso = skb->gso_size, hdrs;
	__u8 doff;

	if (!gso)
		return skb->len > EZ_ETH_HLEN ? skb->len - EZ_ETH_HLEN : 0;
	if (f->proto == EZ_IPPROTO_UDP)
		return f->l4off + 8 + gso;
	if (ez_skb_read(skb, EZ_ETH_HLEN + f->l4off + 12, &doff, 1))
		return 0;
	hdrs = f->l4off + (doff >> 4) * 4;
	return hdrs + gso;
}

#define EZ_AF_INET 2
#define EZ_AF_INET6 10

/*
 * The TOS input of f's FIB lookup: the IPv4 TOS byte, or the IPv6 traffic
 * class and flow label (network order, as bpf_fib_lookup.flowinfo). 0 or
 * -1 (header cut).
 */
static __always_inline int fib_tos(struct __sk_buff *skb, const struct ez_flow *f, __u32 *tos)
{
	if (f->family == 4) {
		__u8 t;

		if (ez_skb_read(skb, EZ_ETH_HLEN + 1, &t, 1))
			return -1;
		*tos = t;
		return 0;
	}
	{
		__be32 w0;

		if (ez_skb_read(skb, EZ_ETH_HLEN, &w0, 4))
			return -1;
		*tos = w0 & bpf_htonl(0x0fffffff);
		return 0;
	}
}

/* fib_forward's answer for a packet it cannot look up exactly. */
#define EZ_FIB_MARKED 100

/*
 * A forwarding FIB lookup (the input route of a packet arriving on
 * ifindex: ip rules, iif, mark and ports count, as for the forward path)
 * with the route MTU checked against l3len (PMTU exceptions and locked
 * route MTUs included). Returns bpf_fib_lookup's result; fib holds the
 * egress ifindex, MACs (SUCCESS) or next hop (NO_NEIGH).
 */
static __always_inline long fib_forward(struct __sk_buff *skb, const struct ez_flow *f, __u32 ifindex, __u32 l3len,
					__u32 tos, struct bpf_fib_lookup *fib)
{
	if (!l3len || l3len > 0xffff)
		return BPF_FIB_LKUP_RET_FRAG_NEEDED;
	fib->l4_protocol = f->proto;
	fib->sport = bpf_htons(f->sport);
	fib->dport = bpf_htons(f->dport);
	fib->tot_len = l3len;
	fib->ifindex = ifindex;
	if (f->family == 4) {
		fib->family = EZ_AF_INET;
		fib->tos = tos;
		fib->ipv4_src = f->saddr[0];
		fib->ipv4_dst = f->daddr[0];
	} else {
		fib->family = EZ_AF_INET6;
		fib->flowinfo = tos;
		__builtin_memcpy(fib->ipv6_src, f->saddr, 16);
		__builtin_memcpy(fib->ipv6_dst, f->daddr, 16);
	}
	if (bpf_core_field_exists(fib->mark)) {
		fib->mark = skb->mark;
		return bpf_fib_lookup(skb, fib, sizeof(*fib), BPF_FIB_LOOKUP_MARK);
	}
	/* Before Linux 6.10 the lookup runs with mark 0 (bpf_ipv4_fib_lookup,
	 * bpf_ipv6_fib_lookup: flowi_mark = 0), the forward path with the
	 * packet's: the same route only for an unmarked packet. */
	if (skb->mark)
		return EZ_FIB_MARKED;
	return bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
}

/* The fallback reason of a FIB result other than SUCCESS and NO_NEIGH. */
static __always_inline __u32 fib_reason(long rc)
{
	switch (rc) {
	case BPF_FIB_LKUP_RET_BLACKHOLE:
	case BPF_FIB_LKUP_RET_UNREACHABLE:
	case BPF_FIB_LKUP_RET_PROHIBIT:
		return EZ_BP_C_FB_FIB_UNREACHABLE;
	case BPF_FIB_LKUP_RET_NOT_FWDED:
	case BPF_FIB_LKUP_RET_FWD_DISABLED:
		return EZ_BP_C_FB_FIB_NOT_FWDED;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		return EZ_BP_C_FB_TOO_BIG;
	case EZ_FIB_MARKED:
		return EZ_BP_C_FB_MARK;
	default:
		return EZ_BP_C_FB_FIB_OTHER;
	}
}

/*
 * Parses and checks what every bypassed packet must be: untagged IPv4 or
 * IPv6, not a fragment, no IPv6 extension header, TCP or UDP with ports.
 * 0 or the fallback reason.
 */
static __always_inline __u32 classify(struct __sk_buff *skb, struct ez_flow *f)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, EZ_ETH_HLEN);
	__u32 zero = 0;
	struct ez_bp_ctl *ctl = bpf_map_lookup_elem(&ez_bp_switch, &zero);

	if (ctl && ctl->paused)
		return EZ_BP_C_FB_PAUSED;
	if (skb->vlan_present)
		return EZ_BP_C_FB_NOT_IP;
	if (p.eth_proto != EZ_ETH_P_IP && p.eth_proto != EZ_ETH_P_IPV6)
		return EZ_BP_C_FB_NOT_IP;
	if (ez_parse(&p, false, f))
		return EZ_BP_C_FB_OTHER;
	if (f->family == 6 && ez_bp_no_ipv6)
		return EZ_BP_C_FB_IPV6_OFF;
	if (f->flags & EZ_FLOW_FRAG || (f->family == 6 && f->proto == 44))
		return EZ_BP_C_FB_FRAGMENT;
	if (f->family == 6 && ipv6_ext(f->proto))
		return EZ_BP_C_FB_IPV6_EXT;
	if (f->proto != EZ_IPPROTO_TCP && f->proto != EZ_IPPROTO_UDP)
		return EZ_BP_C_FB_NOT_TCP_UDP;
	if (f->proto == EZ_IPPROTO_UDP && ez_bp_no_udp)
		return EZ_BP_C_FB_UDP_OFF;
	if (!(f->flags & EZ_FLOW_PORTS) || (f->proto == EZ_IPPROTO_TCP && !(f->flags & EZ_FLOW_TCP)))
		return EZ_BP_C_FB_OTHER;
	/* Conntrack must see a TCP connection open and close (its state
	 * machine; FORWARD rules see the SYN as NEW). */
	if (f->proto == EZ_IPPROTO_TCP && (f->tcp_flags & (EZ_TCP_SYN | EZ_TCP_FIN | EZ_TCP_RST)))
		return EZ_BP_C_FB_TCP_CONTROL;
	return 0;
}

/* The ez_bp_endpoints key of addr, an address of f (source or destination). */
static __always_inline void ep_key_of(const struct ez_flow *f, const __u32 *addr, struct ez_bp_ep_key *key)
{
	if (f->family == 4) {
		key->ip[10] = 0xff;
		key->ip[11] = 0xff;
		__builtin_memcpy(&key->ip[12], &addr[0], 4);
	} else {
		__builtin_memcpy(key->ip, addr, 16);
	}
}

static __always_inline void ep_key(const struct ez_flow *f, struct ez_bp_ep_key *key)
{
	ep_key_of(f, f->daddr, key);
}

/*
 * Anti-spoofing at a pod veth: the packet's source address must be an
 * endpoint of the very veth it entered on, and its source MAC that
 * endpoint's (the pod's eth0). The kernel path would take a forged one
 * through the bridge (ebtables/nft bridge rules a CNI installs against
 * spoofing) and rp_filter; the bypass skips both, so it leaves such packets
 * to them. Checked before the admission (whose lookup refreshes the entry):
 * a forged packet of an admitted flow must not keep it alive either.
 */
static __always_inline bool own_source(struct __sk_buff *skb, const struct ez_flow *f, const struct ethhdr *eth)
{
	struct ez_bp_ep_key key = {};
	struct ez_bp_endpoint *src;

	ep_key_of(f, f->saddr, &key);
	src = bpf_map_lookup_elem(&ez_bp_endpoints, &key);
	return src && src->ifindex == skb->ifindex && mac_eq(eth->h_source, src->pod_mac);
}

/*
 * Anti-spoofing at an uplink, as strict reverse-path filtering
 * (fib_validate_source with rp_filter 1) would do it: the source is no
 * local pod, and the route back to it (a FIB lookup for the source, as a
 * packet arriving on this device) leaves by this device. Stricter than a
 * node with rp_filter 0 or 2: such packets take the kernel path, which
 * applies the node's own setting.
 */
static __always_inline bool source_routes_back(struct __sk_buff *skb, const struct ez_flow *f)
{
	struct bpf_fib_lookup fib = {};
	struct ez_bp_ep_key key = {};
	long rc;

	ep_key_of(f, f->saddr, &key);
	if (bpf_map_lookup_elem(&ez_bp_endpoints, &key))
		return false;
	fib.l4_protocol = f->proto;
	fib.sport = bpf_htons(f->dport);
	fib.dport = bpf_htons(f->sport);
	/* A small tot_len: the lookup checks the route's MTU against it, not
	 * this skb against the device's (bpf_skb_fib_lookup). */
	fib.tot_len = f->l4off + 8;
	fib.ifindex = skb->ifindex;
	if (f->family == 4) {
		fib.family = EZ_AF_INET;
		fib.ipv4_src = f->daddr[0];
		fib.ipv4_dst = f->saddr[0];
	} else {
		fib.family = EZ_AF_INET6;
		__builtin_memcpy(fib.ipv6_src, f->daddr, 16);
		__builtin_memcpy(fib.ipv6_dst, f->saddr, 16);
	}
	/* rp_filter looks up with mark 0 unless src_valid_mark is set
	 * (__fib_validate_source): so does this lookup. */
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	return (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH) && fib.ifindex == skb->ifindex;
}

/*
 * The admission rule, the same for every path: a confirmed conntrack entry
 * (zone 0) without NAT, sequence adjustment or helper, established (TCP)
 * or replied (UDP), whose packet's direction the kernel path delivered
 * (ez_bypass_admit). The lookup runs in skb->dev's netns
 * (BPF_F_CURRENT_NETNS), the node's; either direction's tuple matches and
 * opts.dir says which. Refreshes the entry's timeout. 0 or the fallback
 * reason.
 */
static __always_inline __u32 admitted(struct __sk_buff *skb, const struct ez_flow *f)
{
	struct bpf_sock_tuple tuple = {};
	struct bpf_ct_opts opts = {};
	struct nf_conn *ct;
	unsigned long status;
	__u32 tuple_sz, bit, reason = 0;
	bool ok;

	tuple_sz = ez_ct_tuple(f, &tuple);
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f->proto;
	ct = bpf_skb_ct_lookup(skb, &tuple, tuple_sz, &opts, EZ_CT_OPTS_SZ);
	if (!ct)
		return EZ_BP_C_FB_NO_CONNTRACK;
	status = ct->status;
	if (f->proto == EZ_IPPROTO_TCP)
		ok = ct->proto.tcp.state == TCP_CONNTRACK_ESTABLISHED;
	else
		ok = status & IPS_SEEN_REPLY;
	bit = ez_bp_admit_mark[opts.dir & 1];
	if (!(status & IPS_CONFIRMED) || (status & IPS_DYING))
		reason = EZ_BP_C_FB_NO_CONNTRACK;
	else if (status & (IPS_NAT_MASK | IPS_SEQ_ADJUST))
		reason = EZ_BP_C_FB_NAT;
	else if ((status & (IPS_HELPER | IPS_EXPECTED)) || ct->master)
		reason = EZ_BP_C_FB_HELPER;
	else if (!ok)
		reason = EZ_BP_C_FB_NOT_ESTABLISHED;
	else if (!bit || !(ct->mark & bit))
		reason = EZ_BP_C_FB_NOT_ADMITTED;
	else if (f->proto == EZ_IPPROTO_TCP)
		refresh(ct, 0, ez_bp_tcp_timeout_ms);
	else
		refresh(ct, 1, ez_bp_udp_timeout_ms);
	bpf_ct_release(ct);
	return reason;
}

/*
 * tcx egress of a pod's host-side veth, an uplink and a VXLAN device: what
 * leaves here came through netfilter (FORWARD, POSTROUTING), which accepted it. Marks the
 * packet's direction of its conntrack entry admitted. Never drops.
 */
SEC("tcx/egress")
int ez_bypass_admit(struct __sk_buff *skb)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, EZ_ETH_HLEN);
	struct ez_flow f = {};
	struct bpf_sock_tuple tuple = {};
	struct bpf_ct_opts opts = {};
	struct nf_conn *ct;

	/* Quirk: clang emits structs reached only through pointers as BTF
	 * forward declarations, in an order that follows its memory layout and
	 * so the length of the build directory: `make check-generated` failed
	 * in some checkouts. Naming them here (CO-RE existence checks, always
	 * true, resolved at load) emits them whole and leaves one forward
	 * declaration (struct net): the object is the same everywhere. */
	if (!bpf_core_type_exists(struct bpf_sock) || !bpf_core_type_exists(struct bpf_flow_keys) ||
	    !bpf_core_type_exists(struct nf_ct_ext))
		return TCX_NEXT;
	__u32 tuple_sz, bit, in = skb->ingress_ifindex, out = skb->ifindex;
	struct ez_bp_device *src, *dst;

	/* At an uplink's egress, a packet that arrived on a pod veth came by
	 * the bypass's redirect (the kernel path routes it from the bridge,
	 * where it was received again): admitted already, no lookup. */
	if (in && in != out) {
		src = bpf_map_lookup_elem(&ez_bp_devices, &in);
		if (src && src->kind == EZ_BP_DEV_POD) {
			dst = bpf_map_lookup_elem(&ez_bp_devices, &out);
			if (dst && dst->kind == EZ_BP_DEV_UPLINK)
				return TCX_NEXT;
		}
	}
	if (skb->vlan_present || ez_parse(&p, false, &f))
		return TCX_NEXT;
	if (f.flags & EZ_FLOW_FRAG || !(f.flags & EZ_FLOW_PORTS))
		return TCX_NEXT;
	if (f.proto != EZ_IPPROTO_TCP && f.proto != EZ_IPPROTO_UDP)
		return TCX_NEXT;
	tuple_sz = ez_ct_tuple(&f, &tuple);
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f.proto;
	ct = bpf_skb_ct_lookup(skb, &tuple, tuple_sz, &opts, EZ_CT_OPTS_SZ);
	if (!ct)
		return TCX_NEXT;
	bit = ez_bp_admit_mark[opts.dir & 1];
	if ((ct->status & IPS_CONFIRMED) && bit && !(ct->mark & bit)) {
		ct->mark |= bit;
		count_add(EZ_BP_C_ADMISSIONS, 1);
	}
	bpf_ct_release(ct);
	return TCX_NEXT;
}

/*
 * 0 when skb fits the pod behind host-side veth to: the veth's MTU stands
 * for the pod's eth0 (a CNI sets both alike); GSO packets by segment. Else
 * the fallback reason (< 0 from the helper: no such device).
 */
static __always_inline __u32 fits_pod_mtu(struct __sk_buff *skb, __u32 to, __u32 *mtu)
{
	long r;

	*mtu = 0;
	r = bpf_check_mtu(skb, to, mtu, 0, BPF_MTU_CHK_SEGS);
	if (r < 0)
		return EZ_BP_C_FB_OTHER;
	if (r != EZ_BP_MTU_OK)
		return EZ_BP_C_FB_TOO_BIG;
	return 0;
}

static __always_inline __u32 fits_pod(struct __sk_buff *skb, __u32 to)
{
	__u32 mtu;

	return fits_pod_mtu(skb, to, &mtu);
}

/*
 * fits_pod on a cached record: a frame within the recorded MTU plus
 * Ethernet header fits, as the helper would answer (bpf_skb_check_mtu:
 * skb->len <= mtu + hard_header_len passes, GSO or not); a longer one is
 * checked by the helper. The veth's MTU is the record's: an MTU change
 * notifies RTNLGRP_LINK, which bumps the generation (watchRouting), and
 * the record expires within ez_bp_recheck_ns. Saves a helper call and
 * its device lookup on the packets of a cached flow.
 */
static __always_inline __u32 fits_pod_cached(struct __sk_buff *skb, const struct ez_bp_flow *s)
{
	if (skb->len <= s->frame_max)
		return 0;
	return fits_pod(skb, s->to_ifindex);
}

/* The flow cache's key of f as it entered skb's device. */
static __always_inline void flow_key(struct __sk_buff *skb, const struct ez_flow *f, struct ez_bp_flow_key *k)
{
	__builtin_memcpy(k->saddr, f->saddr, 16);
	__builtin_memcpy(k->daddr, f->daddr, 16);
	k->ifindex = skb->ifindex;
	k->sport = f->sport;
	k->dport = f->dport;
	k->family = f->family;
	k->proto = f->proto;
}

#define EZ_BP_FLOW_KEY_WORDS (sizeof(struct ez_bp_flow_key) / 4)
_Static_assert(__builtin_offsetof(struct ez_bp_flow_key, daddr) == 16 &&
	       __builtin_offsetof(struct ez_bp_flow_key, ifindex) == 32, "flow_slot's word numbers");

/* One word into murmur3's state h. */
static __always_inline __u32 murmur_word(__u32 h, __u32 w)
{
	__u32 x = w * 0xcc9e2d51;

	x = (x << 15) | (x >> 17);
	h ^= x * 0x1b873593;
	return ((h << 13) | (h >> 19)) * 5 + 0xe6546b64;
}

/*
 * k's slot in ez_bp_flows on this CPU: murmur3's mixing, seeded. An IPv4
 * key's address words other than 0 and 4 are 0 (struct ez_flow keeps IPv4
 * in word 0), so they are left out: each word costs a chain of multiplies
 * (the hash was 50 of the cached path's 175 ns, BenchmarkProgBypass, with
 * all 11).
 */
static __always_inline struct ez_bp_flow *flow_slot(const struct ez_bp_flow_key *k)
{
	const __u32 *w = (const __u32 *)k;
	__u32 h = ez_bp_flows_seed, idx;

	if (k->family == 4) {
		h = murmur_word(h, w[0]);
		h = murmur_word(h, w[4]);
	} else {
#pragma unroll
		for (int i = 0; i < 8; i++)
			h = murmur_word(h, w[i]);
	}
#pragma unroll
	for (int i = 8; i < EZ_BP_FLOW_KEY_WORDS; i++)
		h = murmur_word(h, w[i]);
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	idx = h & (EZ_BP_FLOW_SLOTS - 1);
	return bpf_map_lookup_elem(&ez_bp_flows, &idx);
}

static __always_inline bool flow_key_eq(const struct ez_bp_flow_key *a, const struct ez_bp_flow_key *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	__u32 d = 0;

#pragma unroll
	for (int i = 0; i < EZ_BP_FLOW_KEY_WORDS; i++)
		d |= x[i] ^ y[i];
	return !d;
}

/* A packet's place in the flow cache. */
struct flow_ref {
	struct ez_bp_flow *slot;	/* its slot on this CPU; NULL: no cache */
	struct ez_bp_flow_key key;
	__u64 now;
	__u32 gen;			/* ez_bp_flows_gen, read before any check */
	bool valid;			/* slot holds key's record, current */
};

static __always_inline void flow_find(struct __sk_buff *skb, const struct ez_flow *f, struct flow_ref *r)
{
	__u32 zero = 0, *genp;

	if (!ez_bp_recheck_ns)
		return;
	/* The generation is read before the endpoints, devices and FIB:
	 * checks made against a state userspace learns of after this read
	 * carry a generation it has moved past. */
	genp = bpf_map_lookup_elem(&ez_bp_flows_gen, &zero);
	if (!genp)
		return;
	r->gen = *(volatile __u32 *)genp;
	r->now = bpf_ktime_get_ns();
	flow_key(skb, f, &r->key);
	r->slot = flow_slot(&r->key);
	r->valid = r->slot && r->slot->expires > r->now && r->slot->gen == r->gen && flow_key_eq(&r->slot->key, &r->key);
}

/* Records that r's packet passed every check, on the way of kind to
 * ifindex to; the caller fills in the rest. NULL: no cache. */
static __always_inline struct ez_bp_flow *flow_record(struct flow_ref *r, __u32 kind, __u32 to)
{
	struct ez_bp_flow *s = r->slot;

	if (!s)
		return NULL;
	s->key = r->key;
	s->gen = r->gen;
	s->kind = kind;
	s->to_ifindex = to;
	s->expires = r->now + ez_bp_recheck_ns;
	return s;
}

/*
 * Whether the FIB lookup a cross-node record stands on answers this packet
 * the same: the same inputs beyond the key (mark, TOS or traffic class and
 * flow label) and a network-layer length within the one it checked the
 * route MTU for (the check is tot_len > mtu).
 */
static __always_inline bool fib_same(struct __sk_buff *skb, const struct ez_flow *f, const struct ez_bp_flow *s)
{
	__u32 tos, l3len = l3_seg_len(skb, f);

	return !fib_tos(skb, f, &tos) && tos == s->tos && skb->mark == s->mark && l3len && l3len <= s->max_len;
}

/* Records the FIB lookup's inputs beyond the key in s. */
static __always_inline void flow_record_fib(struct ez_bp_flow *s, struct __sk_buff *skb, __u32 tos, __u32 l3len)
{
	s->mark = skb->mark;
	s->tos = tos;
	s->max_len = l3len;
}

/*
 * To another node: a frame to the bridge's MAC (the pod routes via its
 * gateway) is forwarded as the node's routing would, by a FIB lookup as
 * the packet arriving on the bridge: to the uplink or VXLAN device with the
 * looked-up MACs and TTL - 1 (bpf_redirect, or bpf_redirect_neigh when the
 * next hop has no neighbour entry yet). Only to devices the bypass is
 * attached to as uplinks, whose egress program learns the admission. A
 * bpf_redirect is recorded in the flow cache (r), a bpf_redirect_neigh is
 * not.
 */
static __always_inline int to_remote(struct __sk_buff *skb, const struct ez_flow *f, const struct ethhdr *eth,
				     struct flow_ref *r)
{
	struct bpf_fib_lookup fib = {};
	struct ez_bp_device *port, *out;
	struct ez_bp_flow *s;
	__u32 ifx = skb->ifindex, len = skb->len, reason, tos, l3len;
	long rc;

	port = bpf_map_lookup_elem(&ez_bp_devices, &ifx);
	if (!port || port->kind != EZ_BP_DEV_POD)
		return fallback(EZ_BP_C_FB_NO_ENDPOINT);
	if (!mac_eq(eth->h_dest, port->bridge_mac))
		return fallback(EZ_BP_C_FB_NO_ENDPOINT);
	reason = routable(skb, f);
	if (reason)
		return fallback(reason);
	if (fib_tos(skb, f, &tos))
		return fallback(EZ_BP_C_FB_FIB_OTHER);
	l3len = l3_seg_len(skb, f);
	rc = fib_forward(skb, f, port->bridge_ifindex, l3len, tos, &fib);
	if (rc < 0)
		return fallback(EZ_BP_C_FB_FIB_OTHER);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return fallback(fib_reason(rc));
	ifx = fib.ifindex;
	out = bpf_map_lookup_elem(&ez_bp_devices, &ifx);
	if (!out || out->kind != EZ_BP_DEV_UPLINK)
		return fallback(EZ_BP_C_FB_UNKNOWN_DEVICE);
	if (!own_source(skb, f, eth))
		return fallback(EZ_BP_C_FB_SPOOFED);
	reason = admitted(skb, f);
	if (reason)
		return fallback(reason);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		/* The lookup left the next hop (gateway or destination) in
		 * ipv4_dst/ipv6_dst and its family in family. */
		struct bpf_redir_neigh nh = {};

		nh.nh_family = fib.family;
		if (fib.family == EZ_AF_INET)
			nh.ipv4_nh = fib.ipv4_dst;
		else
			__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
		if (ttl_decrement(skb, f))
			return fallback(EZ_BP_C_FB_OTHER);
		count_add(EZ_BP_C_OUT_PACKETS, 1);
		count_add(EZ_BP_C_OUT_BYTES, len);
		count_add(EZ_BP_C_OUT_NEIGH, 1);
		return bpf_redirect_neigh(ifx, &nh, sizeof(nh), 0);
	}
	s = flow_record(r, EZ_BP_FLOW_OUT, ifx);
	if (s) {
		flow_record_fib(s, skb, tos, l3len);
		__builtin_memcpy(s->src_mac, eth->h_source, 6);
		__builtin_memcpy(s->bridge_mac, port->bridge_mac, 6);
		__builtin_memcpy(s->out_dmac, fib.dmac, 6);
		__builtin_memcpy(s->out_smac, fib.smac, 6);
	}
	if (ttl_decrement(skb, f) || mac_store(skb, fib.dmac, fib.smac))
		return fallback(EZ_BP_C_FB_OTHER);
	count_add(EZ_BP_C_OUT_PACKETS, 1);
	count_add(EZ_BP_C_OUT_BYTES, len);
	return bpf_redirect(ifx, 0);
}

/* To another node on a cached record (fib_same held): what every packet
 * is still checked for (to_remote's order), then the recorded MACs. */
static __always_inline int to_remote_cached(struct __sk_buff *skb, const struct ez_flow *f, const struct ethhdr *eth,
					    const struct ez_bp_flow *s)
{
	__u32 len = skb->len, reason;

	if (!mac_eq(eth->h_dest, s->bridge_mac))
		return fallback(EZ_BP_C_FB_NO_ENDPOINT);
	reason = routable(skb, f);
	if (reason)
		return fallback(reason);
	if (!mac_eq(eth->h_source, s->src_mac))
		return fallback(EZ_BP_C_FB_SPOOFED);
	if (ttl_decrement(skb, f) || mac_store(skb, s->out_dmac, s->out_smac))
		return fallback(EZ_BP_C_FB_OTHER);
	count_add(EZ_BP_C_OUT_PACKETS, 1);
	count_add(EZ_BP_C_OUT_BYTES, len);
	count_add(EZ_BP_C_CACHED, 1);
	return bpf_redirect(s->to_ifindex, 0);
}

/*
 * tcx ingress of each pod's host-side veth (packets leaving the pod): to a
 * local pod straight into it, to another node's pod to the uplink or VXLAN
 * device (to_remote).
 *
 * The endpoint or FIB route, source and admission checks of a flow
 * direction are made in full once per ez_bp_recheck_ns and CPU (the flow
 * cache); every packet is still classified, its source MAC, destination
 * MAC, TTL and length checked (cross-node: its FIB inputs, fib_same). So a
 * conntrack entry deleted or changed (by conntrack -D, a policy agent, a
 * FIN) holds for the bypass within ez_bp_recheck_ns; an endpoint change at
 * once, a route or neighbour change once userspace has read its
 * notification (within ez_bp_recheck_ns at the latest).
 */
SEC("tcx/ingress")
int ez_bypass(struct __sk_buff *skb)
{
	struct ez_flow f = {};
	struct ez_bp_ep_key key = {};
	struct flow_ref fr = {};
	struct ez_bp_endpoint *ep;
	struct ez_bp_flow *slot;
	struct ethhdr eth;
	__u32 len = skb->len, reason, to, mtu = 0;
	const __u8 *pod_mac, *bridge_mac;
	bool routed = false, cached = false;

	reason = classify(skb, &f);
	if (reason)
		return fallback(reason);
	if (ez_skb_read(skb, 0, &eth, sizeof(eth)))
		return fallback(EZ_BP_C_FB_OTHER);
	flow_find(skb, &f, &fr);
	slot = fr.slot;
	if (fr.valid && slot) {
		if (slot->kind == EZ_BP_FLOW_OUT && fib_same(skb, &f, slot))
			return to_remote_cached(skb, &f, &eth, slot);
		cached = slot->kind == EZ_BP_FLOW_LOCAL;
	}
	if (cached) {
		/* The source address is the veth's pod's (checked in full);
		 * the MAC is checked on every packet. */
		if (!mac_eq(eth.h_source, slot->src_mac))
			return fallback(EZ_BP_C_FB_SPOOFED);
		to = slot->to_ifindex;
		pod_mac = slot->pod_mac;
		bridge_mac = slot->bridge_mac;
	} else {
		ep_key(&f, &key);
		ep = bpf_map_lookup_elem(&ez_bp_endpoints, &key);
		if (!ep)
			return to_remote(skb, &f, &eth, &fr);
		if (ep->ifindex == skb->ifindex)
			return fallback(EZ_BP_C_FB_OTHER);
		to = ep->ifindex;
		pod_mac = ep->pod_mac;
		bridge_mac = ep->bridge_mac;
	}

	/*
	 * Pods of one node share the bridge's L2: a frame to a local pod
	 * already carries that pod's MAC and the bridge forwards it unchanged,
	 * so nothing is rewritten. A frame to the bridge's MAC (a pod routing
	 * via its gateway) is routed by the node, which leaves it with the
	 * bridge's MAC as source, the pod's as destination, and TTL or hop
	 * limit one less: the bypass does the same.
	 */
	if (!mac_eq(eth.h_dest, pod_mac)) {
		if (!mac_eq(eth.h_dest, bridge_mac))
			return fallback(EZ_BP_C_FB_MAC_MISMATCH);
		reason = routable(skb, &f);
		if (reason)
			return fallback(reason);
		routed = true;
	}

	if (cached)
		reason = fits_pod_cached(skb, slot);
	else
		reason = fits_pod_mtu(skb, to, &mtu);
	if (reason)
		return fallback(reason);

	if (!cached) {
		if (!own_source(skb, &f, &eth))
			return fallback(EZ_BP_C_FB_SPOOFED);
		reason = admitted(skb, &f);
		if (reason)
			return fallback(reason);
		slot = flow_record(&fr, EZ_BP_FLOW_LOCAL, to);
		if (slot) {
			slot->frame_max = mtu + EZ_ETH_HLEN;
			__builtin_memcpy(slot->src_mac, eth.h_source, 6);
			__builtin_memcpy(slot->pod_mac, pod_mac, 6);
			__builtin_memcpy(slot->bridge_mac, bridge_mac, 6);
		}
	}

	/* bpf_redirect_peer is allowed from tc/tcx ingress only, and only to a
	 * device whose peer is in another netns (a veth into its pod). The
	 * peer receives the frame as if from the wire (skb_scrub_packet:
	 * PACKET_HOST, no dst). */
	if (routed) {
		__u8 pm[6], bm[6];

		/* Copied first: pod_mac may point into the slot, which
		 * nothing else writes on this CPU, or the endpoint. */
		__builtin_memcpy(pm, pod_mac, 6);
		__builtin_memcpy(bm, bridge_mac, 6);
		if (ttl_decrement(skb, &f) || mac_store(skb, pm, bm))
			return fallback(EZ_BP_C_FB_OTHER);
	}
	count_add(EZ_BP_C_PACKETS, 1);
	count_add(EZ_BP_C_BYTES, len);
	if (routed)
		count_add(EZ_BP_C_ROUTED, 1);
	if (cached)
		count_add(EZ_BP_C_CACHED, 1);
	return bpf_redirect_peer(to, 0);
}

/*
 * tcx ingress of an uplink or VXLAN device (the VXLAN device's ingress sees
 * the decapsulated frame): a packet from another node to a local pod goes
 * straight into the pod, as routing would deliver it (FIB lookup as the
 * packet arriving here: the route must lead to the pod's bridge and the
 * neighbour to its MAC), MACs bridge -> pod, TTL - 1. The endpoint, FIB,
 * source and admission checks are cached as ez_bypass's are (the key has
 * the uplink); every packet is still classified and checked for its MAC,
 * FIB inputs (fib_same), TTL and the pod veth's MTU.
 */
SEC("tcx/ingress")
int ez_bypass_in(struct __sk_buff *skb)
{
	struct ez_flow f = {};
	struct ez_bp_ep_key key = {};
	struct flow_ref fr = {};
	struct ez_bp_endpoint *ep;
	struct ez_bp_flow *s;
	struct bpf_fib_lookup fib = {};
	__u32 len = skb->len, reason, tos = 0, l3len = 0, to, mtu = 0;
	__u8 dmac[6], smac[6];
	bool cached = false;
	long rc;

	reason = classify(skb, &f);
	if (reason)
		return fallback(reason);
	/* Not to this device's MAC: the node would not route it. */
	if (skb->pkt_type != 0 /* PACKET_HOST */)
		return fallback(EZ_BP_C_FB_MAC_MISMATCH);
	flow_find(skb, &f, &fr);
	s = fr.slot;
	if (fr.valid && s && s->kind == EZ_BP_FLOW_IN && fib_same(skb, &f, s)) {
		reason = routable(skb, &f);
		if (reason)
			return fallback(reason);
		to = s->to_ifindex;
		__builtin_memcpy(dmac, s->out_dmac, 6);
		__builtin_memcpy(smac, s->out_smac, 6);
		cached = true;
	} else {
		ep_key(&f, &key);
		ep = bpf_map_lookup_elem(&ez_bp_endpoints, &key);
		if (!ep)
			return fallback(EZ_BP_C_FB_NO_ENDPOINT);
		reason = routable(skb, &f);
		if (reason)
			return fallback(reason);
		if (fib_tos(skb, &f, &tos))
			return fallback(EZ_BP_C_FB_FIB_OTHER);
		l3len = l3_seg_len(skb, &f);
		rc = fib_forward(skb, &f, skb->ifindex, l3len, tos, &fib);
		if (rc < 0)
			return fallback(EZ_BP_C_FB_FIB_OTHER);
		if (rc == BPF_FIB_LKUP_RET_NO_NEIGH)
			return fallback(EZ_BP_C_FB_ROUTE_MISMATCH);
		if (rc != BPF_FIB_LKUP_RET_SUCCESS)
			return fallback(fib_reason(rc));
		if (fib.ifindex != ep->bridge_ifindex || !mac_eq(fib.dmac, ep->pod_mac))
			return fallback(EZ_BP_C_FB_ROUTE_MISMATCH);
		to = ep->ifindex;
		__builtin_memcpy(dmac, ep->pod_mac, 6);
		__builtin_memcpy(smac, fib.smac, 6);
	}
	if (cached)
		reason = fits_pod_cached(skb, s);
	else
		reason = fits_pod_mtu(skb, to, &mtu);
	if (reason)
		return fallback(reason);
	if (!cached) {
		if (!source_routes_back(skb, &f))
			return fallback(EZ_BP_C_FB_SPOOFED);
		reason = admitted(skb, &f);
		if (reason)
			return fallback(reason);
		s = flow_record(&fr, EZ_BP_FLOW_IN, to);
		if (s) {
			flow_record_fib(s, skb, tos, l3len);
			s->frame_max = mtu + EZ_ETH_HLEN;
			__builtin_memcpy(s->out_dmac, dmac, 6);
			__builtin_memcpy(s->out_smac, smac, 6);
		}
	}
	if (ttl_decrement(skb, &f) || mac_store(skb, dmac, smac))
		return fallback(EZ_BP_C_FB_OTHER);
	count_add(EZ_BP_C_IN_PACKETS, 1);
	count_add(EZ_BP_C_IN_BYTES, len);
	if (cached)
		count_add(EZ_BP_C_CACHED, 1);
	return bpf_redirect_peer(to, 0);
}
