/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Packet identity: a lifetime is keyed by sk_buff address and moves forward
 * through enum ez_trc_stage. A stage earlier than the last one recorded, or
 * a record idle longer than ez_trc_cfg.max_age_ns, means the address now carries
 * another packet: the old lifetime is emitted and a new one starts.
 */
#ifndef EZ_TRACER_TRACK_H
#define EZ_TRACER_TRACK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "lib/parse.h"
#include "tracer/tracer.h"
#include "tracer/flow.h"
#include "tracer/filter.h"

/* What a hook observes; trc_stage names the stage on the host or pod side. */
enum trc_kind {
	TRC_K_NF_PRE,	/* == NF_INET_PRE_ROUTING .. */
	TRC_K_NF_IN,
	TRC_K_NF_FWD,
	TRC_K_NF_OUT,
	TRC_K_NF_POST,	/* .. == NF_INET_POST_ROUTING */
	TRC_K_QUEUE,
	TRC_K_XMIT,
	TRC_K_RX,
	TRC_K_RECV,
	TRC_K_TCXI_FIRST,
	TRC_K_TCXI_LAST,
	TRC_K_TCXE_FIRST,
	TRC_K_TCXE_LAST,
	TRC_K_DONE,
};

static __always_inline __u32 trc_stage(__u32 kind, bool host)
{
	switch (kind) {
	case TRC_K_NF_PRE: return host ? EZ_TRC_H_NF_PRE : EZ_TRC_P_NF_PRE;
	case TRC_K_NF_IN: return host ? EZ_TRC_H_NF_IN : EZ_TRC_P_NF_IN;
	case TRC_K_NF_FWD: return host ? EZ_TRC_H_NF_FWD : EZ_TRC_P_NF_FWD;
	case TRC_K_NF_OUT: return host ? EZ_TRC_H_NF_OUT : EZ_TRC_P_NF_OUT;
	case TRC_K_NF_POST: return host ? EZ_TRC_H_NF_POST : EZ_TRC_P_NF_POST;
	case TRC_K_QUEUE: return host ? EZ_TRC_H_QUEUE : EZ_TRC_P_QUEUE;
	case TRC_K_XMIT: return host ? EZ_TRC_H_XMIT : EZ_TRC_P_XMIT;
	case TRC_K_RX: return host ? EZ_TRC_H_RX : EZ_TRC_P_RX;
	case TRC_K_RECV: return host ? EZ_TRC_H_RECV : EZ_TRC_P_RECV;
	case TRC_K_TCXI_FIRST: return host ? EZ_TRC_H_TCXI_FIRST : EZ_TRC_P_TCXI_FIRST;
	case TRC_K_TCXI_LAST: return host ? EZ_TRC_H_TCXI_LAST : EZ_TRC_P_TCXI_LAST;
	case TRC_K_TCXE_FIRST: return host ? EZ_TRC_H_TCXE_FIRST : EZ_TRC_P_TCXE_FIRST;
	case TRC_K_TCXE_LAST: return host ? EZ_TRC_H_TCXE_LAST : EZ_TRC_P_TCXE_LAST;
	default: return host ? EZ_TRC_H_DONE : EZ_TRC_P_DONE;
	}
}

/* Which side a namespace is on: the tracer's own and ez_trc_cfg.hosts are
 * hosts (nodes), ez_trc_cfg.wires are not traced, any other is a pod. */
enum trc_side {
	TRC_SIDE_POD,
	TRC_SIDE_HOST,
	TRC_SIDE_WIRE,
};

static __always_inline enum trc_side trc_side(__u64 netns)
{
	if (netns == ez_trc_cfg.host_netns)
		return TRC_SIDE_HOST;
	for (int i = 0; i < EZ_TRC_MAX_HOSTS; i++)
		if (ez_trc_cfg.hosts[i] && netns == ez_trc_cfg.hosts[i])
			return TRC_SIDE_HOST;
	for (int i = 0; i < EZ_TRC_MAX_WIRES; i++)
		if (ez_trc_cfg.wires[i] && netns == ez_trc_cfg.wires[i])
			return TRC_SIDE_WIRE;
	return TRC_SIDE_POD;
}

static __always_inline bool trc_host_stage(__u32 stage)
{
	return (stage >= EZ_TRC_H_RX && stage <= EZ_TRC_H_XMIT) || stage == EZ_TRC_H_DONE;
}

/* trc_second_host maps an H_ stage to its H2_ twin. */
static __always_inline __u32 trc_second_host(__u32 stage)
{
	if (stage == EZ_TRC_H_DONE)
		return EZ_TRC_H2_DONE;
	return stage + (EZ_TRC_H2_RX - EZ_TRC_H_RX);
}

/*
 * trc_retransmit: a packet that a host transmitted on one device (last is
 * H_XMIT or H2_XMIT) is transmitted again by the same host on another: a
 * bridge device hands it to a port (a routed packet to a local pod), a
 * tunnel to its underlay. st is one of that host's transmit stages
 * (NF_OUT .. QUEUE). The lifetime goes on; it is not a new packet.
 */
static __always_inline bool trc_retransmit(const struct ez_trc_pkt *r, __u32 st, __u32 ifindex)
{
	if (!ifindex || ifindex == r->last_ifindex)
		return false;
	if (r->last == EZ_TRC_H_XMIT)
		return st >= EZ_TRC_H_NF_OUT && st <= EZ_TRC_H_QUEUE;
	if (r->last == EZ_TRC_H2_XMIT)
		return st >= EZ_TRC_H2_NF_OUT && st <= EZ_TRC_H2_QUEUE;
	return false;
}

/* Waking the reader costs microseconds per record (irq_work, epoll): the
 * reader polls every few ms instead, and is woken only when the ring is half
 * full. */
static __always_inline void trc_emit(struct ez_trc_pkt *r, __u8 end)
{
	__u64 flags = bpf_ringbuf_query(&trc_events, BPF_RB_AVAIL_DATA) > TRC_RING_BYTES / 2 ?
		BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;

	r->end = end;
	if (bpf_ringbuf_output(&trc_events, r, sizeof(*r), flags))
		trc_count(EZ_TRC_C_RB_DROPS, 1);
	else
		trc_count(EZ_TRC_C_EMITTED, 1);
}

/* trc_track records stage for skb, seen in netns on ifindex, and returns the
 * live record, or NULL when the packet is not traced. A host stage (H_) seen
 * in a host namespace other than the lifetime's first one is recorded as its
 * H2_ twin. */
static __always_inline struct ez_trc_pkt *
trc_track(struct sk_buff *skb, __u32 stage, enum trc_l3 where, __u64 netns, __u32 ifindex)
{
	__u64 key = (__u64)skb, now = bpf_ktime_get_ns();
	struct ez_trc_pkt *r = bpf_map_lookup_elem(&trc_pkts, &key);
	struct ez_flow fl = {};
	__u32 zero = 0;

	if (stage >= EZ_TRC_STAGES)
		return NULL;
	if (r) {
		bool aged = ez_trc_cfg.max_age_ns && now - r->last_ns > ez_trc_cfg.max_age_ns;
		bool host = trc_host_stage(stage);
		__u32 st = stage;

		if (host && r->host1 && r->host1 != netns)
			st = trc_second_host(stage);
		if (st >= EZ_TRC_STAGES)
			return NULL;
		if (!aged && st >= EZ_TRC_ORDERED) {
			if (!r->ts[st])
				r->ts[st] = now;
			return r;
		}
		if (!aged && st > r->last) {
			if (host && !r->host1)
				r->host1 = netns;
			r->ts[st] = now;
			r->last = st;
			r->last_ns = now;
			r->last_cpu = bpf_get_smp_processor_id();
			if (ifindex)
				r->last_ifindex = ifindex;
			return r;
		}
		if (!aged && st == r->last)
			return r; /* seen again at the same stage: keep the first time */
		if (!aged && trc_retransmit(r, st, ifindex)) {
			/* The transmit stages are the last device's: clear those of
			 * the previous one (at most NF_OUT+1 .. XMIT, five stages). */
			for (__u32 i = 1; i <= EZ_TRC_H_XMIT - EZ_TRC_H_NF_OUT; i++) {
				__u32 j = st + i;

				if (j > r->last || j >= EZ_TRC_STAGES)
					break;
				r->ts[j] = 0;
			}
			r->ts[st] = now;
			r->last = st;
			r->last_ns = now;
			r->last_cpu = bpf_get_smp_processor_id();
			r->last_ifindex = ifindex;
			return r;
		}
		trc_count(aged ? EZ_TRC_C_AGED : EZ_TRC_C_REUSED, 1);
		trc_emit(r, aged ? EZ_TRC_END_AGED : EZ_TRC_END_REUSED);
		bpf_map_delete_elem(&trc_pkts, &key);
	}
	/* Reading, freeing and xmit-done never start a lifetime. */
	if (stage >= EZ_TRC_COPY)
		return NULL;
	if (trc_parse(skb, where, &fl) || !trc_match(&fl, ifindex, netns))
		return NULL;
	r = bpf_map_lookup_elem(&trc_scratch, &zero);
	if (!r)
		return NULL;
	__builtin_memset(r, 0, sizeof(*r));
	__builtin_memcpy(r->saddr, fl.saddr, sizeof(fl.saddr));
	__builtin_memcpy(r->daddr, fl.daddr, sizeof(fl.daddr));
	r->sport = fl.sport;
	r->dport = fl.dport;
	r->family = fl.family;
	r->proto = fl.proto;
	r->skb = key;
	r->netns = netns;
	r->host1 = trc_host_stage(stage) ? netns : 0;
	r->ts[stage] = now;
	r->last = stage;
	r->last_ns = now;
	r->first_cpu = r->last_cpu = bpf_get_smp_processor_id();
	r->first_ifindex = r->last_ifindex = ifindex;
	r->len = BPF_CORE_READ(skb, len);
	if (bpf_map_update_elem(&trc_pkts, &key, r, BPF_NOEXIST)) {
		trc_count(EZ_TRC_C_TABLE_FULL, 1);
		return NULL;
	}
	trc_count(EZ_TRC_C_STARTED, 1);
	return bpf_map_lookup_elem(&trc_pkts, &key);
}

/* trc_free ends skb's lifetime, if it has one. */
static __always_inline void trc_free(struct sk_buff *skb, __u32 drop_reason)
{
	__u64 key = (__u64)skb;
	struct ez_trc_pkt *r = bpf_map_lookup_elem(&trc_pkts, &key);

	if (!r)
		return;
	r->ts[EZ_TRC_FREE] = bpf_ktime_get_ns();
	r->drop_reason = drop_reason;
	trc_emit(r, drop_reason ? EZ_TRC_END_DROP : EZ_TRC_END_FREE);
	bpf_map_delete_elem(&trc_pkts, &key);
}

/*
 * trc_dev tracks a device-level stage: side and interface from skb->dev.
 * btf: skb is a BTF pointer (tp_btf, tcx via bpf_cast_to_kern_ctx), so the
 * kernel is read with direct loads; raw_tp passes false and reads through
 * bpf_probe_read_kernel. The flag is a constant at every call site: the
 * other branch is compiled out (and the verifier never sees it).
 */
static __always_inline void trc_dev(struct sk_buff *skb, __u32 kind, enum trc_l3 where, bool btf)
{
	struct net_device *dev = btf ? skb->dev : BPF_CORE_READ(skb, dev);
	__u32 ifindex;
	__u64 netns;

	if (!dev)
		return;
	netns = btf ? dev->nd_net.net->net_cookie : BPF_CORE_READ(dev, nd_net.net, net_cookie);
	ifindex = btf ? dev->ifindex : BPF_CORE_READ(dev, ifindex);
	enum trc_side side = trc_side(netns);

	if (side == TRC_SIDE_WIRE)
		return;
	trc_track(skb, trc_stage(kind, side == TRC_SIDE_HOST), where, netns, ifindex);
}

#endif
