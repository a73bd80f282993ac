// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Bridge bypass, same node: a tcx ingress program on the host-side veth of
 * each pod (packets leaving the pod). An established TCP or UDP flow to
 * another local pod, whose conntrack entry netfilter already confirmed
 * without NAT, is redirected straight into the destination pod's eth0,
 * skipping the bridge, br_netfilter and iptables (frames the node would route
 * are rewritten as routing would). Everything else continues on the kernel
 * path (TCX_NEXT) with its reason counted. Nothing is dropped.
 *
 * A direction of a flow is bypassed only after the kernel path delivered one
 * of its packets to the destination pod's veth (ez_bypass_admit, tcx egress):
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
#include "bypass/bypass.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that BTF, and so bpf2go, carries the enum Go names. */
const enum ez_bp_counter ez_bp_counter_enum __attribute__((unused));

/* Conntrack kfuncs (net/netfilter/nf_conntrack_bpf.c; tc and XDP only). */
extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;
extern int bpf_ct_change_timeout(struct nf_conn *ct, __u32 timeout_ms) __ksym;

/* Local pods by address, written by userspace. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, struct ez_bp_ep_key);
	__type(value, struct ez_bp_endpoint);
} ez_bp_endpoints SEC(".maps");

EZ_COUNTER_MAP(ez_bp_counters, EZ_BP_C_MAX);

/*
 * Conntrack timeouts (ms) the bypass refreshes established entries to, set
 * before load from the node netns's sysctls (nf_conntrack_tcp_timeout_established,
 * nf_conntrack_udp_timeout_stream). Bypassed packets skip conntrack, which
 * would otherwise refresh the entry on every packet.
 */
volatile const __u32 ez_bp_tcp_timeout_ms = 0;
volatile const __u32 ez_bp_udp_timeout_ms = 0;

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
	return *(const __u32 *)a == *(const __u32 *)b && *(const __u16 *)(a + 4) == *(const __u16 *)(b + 4);
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

/* The flow's tuple for the conntrack lookup; ports to network order. */
static __always_inline __u32 ct_tuple(const struct ez_flow *f, struct bpf_sock_tuple *tuple)
{
	if (f->family == 4) {
		tuple->ipv4.saddr = f->saddr[0];
		tuple->ipv4.daddr = f->daddr[0];
		tuple->ipv4.sport = bpf_htons(f->sport);
		tuple->ipv4.dport = bpf_htons(f->dport);
		return sizeof(tuple->ipv4);
	}
	__builtin_memcpy(tuple->ipv6.saddr, f->saddr, 16);
	__builtin_memcpy(tuple->ipv6.daddr, f->daddr, 16);
	tuple->ipv6.sport = bpf_htons(f->sport);
	tuple->ipv6.dport = bpf_htons(f->dport);
	return sizeof(tuple->ipv6);
}

/*
 * What the node's routing would do to a frame it forwards to a pod on its
 * bridge: MACs bridge -> pod, TTL/hop limit - 1 (IPv4: header checksum
 * updated; IPv6: CHECKSUM_COMPLETE updated). A failure before any byte is
 * written leaves the frame intact; the writes are of fixed, checked offsets.
 */
static __always_inline int route_rewrite(struct __sk_buff *skb, const struct ez_flow *f, const struct ez_bp_endpoint *ep)
{
	__u8 macs[12];

	__builtin_memcpy(macs, ep->pod_mac, 6);
	__builtin_memcpy(macs + 6, ep->bridge_mac, 6);
	if (f->family == 4) {
		__u16 old, new;

		if (bpf_skb_load_bytes(skb, EZ_ETH_HLEN + 8, &old, 2))
			return -1;
		new = old;
		((__u8 *)&new)[0] -= 1;
		if (bpf_l3_csum_replace(skb, EZ_ETH_HLEN + 10, old, new, 2))
			return -1;
		if (bpf_skb_store_bytes(skb, EZ_ETH_HLEN + 8, &new, 2, 0))
			return -1;
	} else {
		__u8 hl;

		if (bpf_skb_load_bytes(skb, EZ_ETH_HLEN + 7, &hl, 1))
			return -1;
		hl -= 1;
		if (bpf_skb_store_bytes(skb, EZ_ETH_HLEN + 7, &hl, 1, BPF_F_RECOMPUTE_CSUM))
			return -1;
	}
	return bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) ? -1 : 0;
}

/*
 * tcx egress of a pod's host-side veth: what leaves here towards the pod
 * came through the bridge and netfilter, which accepted it. Marks the
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
	__u32 tuple_sz, bit;

	if (skb->vlan_present || ez_parse(&p, false, &f))
		return TCX_NEXT;
	if (f.flags & EZ_FLOW_FRAG || !(f.flags & EZ_FLOW_PORTS))
		return TCX_NEXT;
	if (f.proto != EZ_IPPROTO_TCP && f.proto != EZ_IPPROTO_UDP)
		return TCX_NEXT;
	tuple_sz = ct_tuple(&f, &tuple);
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f.proto;
	ct = bpf_skb_ct_lookup(skb, &tuple, tuple_sz, &opts, sizeof(opts));
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

SEC("tcx/ingress")
int ez_bypass(struct __sk_buff *skb)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, EZ_ETH_HLEN);
	struct ez_flow f = {};
	struct ez_bp_ep_key key = {};
	struct ez_bp_endpoint *ep;
	struct ethhdr eth;
	struct bpf_sock_tuple tuple = {};
	struct bpf_ct_opts opts = {};
	struct nf_conn *ct;
	__u32 tuple_sz, mtu = 0, len = skb->len;
	unsigned long status;
	bool ok, routed = false;
	__u8 ttl;

	if (skb->vlan_present)
		return fallback(EZ_BP_C_FB_NOT_IP);
	if (p.eth_proto != EZ_ETH_P_IP && p.eth_proto != EZ_ETH_P_IPV6)
		return fallback(EZ_BP_C_FB_NOT_IP);
	if (ez_parse(&p, false, &f))
		return fallback(EZ_BP_C_FB_OTHER);
	if (f.flags & EZ_FLOW_FRAG || (f.family == 6 && f.proto == 44))
		return fallback(EZ_BP_C_FB_FRAGMENT);
	if (f.family == 6 && ipv6_ext(f.proto))
		return fallback(EZ_BP_C_FB_IPV6_EXT);
	if (f.proto != EZ_IPPROTO_TCP && f.proto != EZ_IPPROTO_UDP)
		return fallback(EZ_BP_C_FB_NOT_TCP_UDP);
	if (!(f.flags & EZ_FLOW_PORTS) || (f.proto == EZ_IPPROTO_TCP && !(f.flags & EZ_FLOW_TCP)))
		return fallback(EZ_BP_C_FB_OTHER);

	if (f.family == 4) {
		key.ip[10] = 0xff;
		key.ip[11] = 0xff;
		__builtin_memcpy(&key.ip[12], &f.daddr[0], 4);
	} else {
		__builtin_memcpy(key.ip, f.daddr, 16);
	}
	ep = bpf_map_lookup_elem(&ez_bp_endpoints, &key);
	if (!ep)
		return fallback(EZ_BP_C_FB_NO_ENDPOINT);
	if (ep->ifindex == skb->ifindex)
		return fallback(EZ_BP_C_FB_OTHER);

	/*
	 * Pods of one node share the bridge's L2: a frame to a local pod
	 * already carries that pod's MAC and the bridge forwards it unchanged,
	 * so nothing is rewritten. A frame to the bridge's MAC (a pod routing
	 * via its gateway) is routed by the node, which leaves it with the
	 * bridge's MAC as source, the pod's as destination, and TTL or hop
	 * limit one less: the bypass does the same.
	 */
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)))
		return fallback(EZ_BP_C_FB_OTHER);
	if (!mac_eq(eth.h_dest, ep->pod_mac)) {
		if (!mac_eq(eth.h_dest, ep->bridge_mac))
			return fallback(EZ_BP_C_FB_MAC_MISMATCH);
		if (bpf_skb_load_bytes(skb, EZ_ETH_HLEN + (f.family == 4 ? 8 : 7), &ttl, 1))
			return fallback(EZ_BP_C_FB_OTHER);
		if (ttl <= 1)
			return fallback(EZ_BP_C_FB_TTL);
		routed = true;
	}

	/* Conntrack must see a TCP connection open and close (its state
	 * machine; FORWARD rules see the SYN as NEW). */
	if (f.proto == EZ_IPPROTO_TCP && (f.tcp_flags & (EZ_TCP_SYN | EZ_TCP_FIN | EZ_TCP_RST)))
		return fallback(EZ_BP_C_FB_TCP_CONTROL);

	/* The host-side veth's MTU stands for the pod's eth0 (a CNI sets both
	 * alike). GSO packets are checked by segment. < 0: no such device. */
	{
		long r = bpf_check_mtu(skb, ep->ifindex, &mtu, 0, 0);

		if (r < 0)
			return fallback(EZ_BP_C_FB_OTHER);
		if (r != EZ_BP_MTU_OK)
			return fallback(EZ_BP_C_FB_TOO_BIG);
	}

	tuple_sz = ct_tuple(&f, &tuple);
	/*
	 * The lookup runs in skb->dev's netns (BPF_F_CURRENT_NETNS): the
	 * node's, where br_netfilter tracks bridged pod traffic. Zone 0 only
	 * (ct_zone_id 0): flows a CT target put in another zone are not found
	 * and take the kernel path. Either direction's tuple matches; opts.dir
	 * says which.
	 */
	opts.netns_id = BPF_F_CURRENT_NETNS;
	opts.l4proto = f.proto;
	ct = bpf_skb_ct_lookup(skb, &tuple, tuple_sz, &opts, sizeof(opts));
	if (!ct)
		return fallback(EZ_BP_C_FB_NO_CONNTRACK);
	status = ct->status;
	if (!(status & IPS_CONFIRMED) || (status & IPS_DYING)) {
		bpf_ct_release(ct);
		return fallback(EZ_BP_C_FB_NO_CONNTRACK);
	}
	if (status & (IPS_NAT_MASK | IPS_SEQ_ADJUST)) {
		bpf_ct_release(ct);
		return fallback(EZ_BP_C_FB_NAT);
	}
	if ((status & (IPS_HELPER | IPS_EXPECTED)) || ct->master) {
		bpf_ct_release(ct);
		return fallback(EZ_BP_C_FB_HELPER);
	}
	if (f.proto == EZ_IPPROTO_TCP)
		ok = ct->proto.tcp.state == TCP_CONNTRACK_ESTABLISHED;
	else
		ok = status & IPS_SEEN_REPLY;
	if (!ok) {
		bpf_ct_release(ct);
		return fallback(EZ_BP_C_FB_NOT_ESTABLISHED);
	}
	{
		__u32 bit = ez_bp_admit_mark[opts.dir & 1];

		if (!bit || !(ct->mark & bit)) {
			bpf_ct_release(ct);
			return fallback(EZ_BP_C_FB_NOT_ADMITTED);
		}
	}
	if (f.proto == EZ_IPPROTO_TCP)
		refresh(ct, 0, ez_bp_tcp_timeout_ms);
	else
		refresh(ct, 1, ez_bp_udp_timeout_ms);
	bpf_ct_release(ct);

	/* bpf_redirect_peer is allowed from tc/tcx ingress only, and only to a
	 * device whose peer is in another netns (a veth into its pod). The
	 * peer receives the frame as if from the wire (PACKET_HOST, no dst). */
	if (routed && route_rewrite(skb, &f, ep))
		return fallback(EZ_BP_C_FB_OTHER);
	count_add(EZ_BP_C_PACKETS, 1);
	count_add(EZ_BP_C_BYTES, len);
	if (routed)
		count_add(EZ_BP_C_ROUTED, 1);
	return bpf_redirect_peer(ep->ifindex, 0);
}
