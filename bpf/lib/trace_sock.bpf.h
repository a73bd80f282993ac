/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Socket-level counters: sendmsg/recvmsg of sockets the filter selects.
 * With the socket shortcut, data moves from socket to socket through
 * sk_msg redirect and no sk_buff stage fires; these counters show the bytes
 * that took the saved path (skmsg.bpf.h itself is not instrumented).
 */
#pragma once

static __always_inline bool trc_sock_match(struct sock *sk)
{
	struct trc_flow fl = {};
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);

	if (family == 2 /* AF_INET */) {
		fl.family = 4;
		fl.saddr[0] = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
		fl.daddr[0] = BPF_CORE_READ(sk, __sk_common.skc_daddr);
	} else if (family == 10 /* AF_INET6 */) {
		fl.family = 6;
		BPF_CORE_READ_INTO(&fl.saddr, sk, __sk_common.skc_v6_rcv_saddr);
		BPF_CORE_READ_INTO(&fl.daddr, sk, __sk_common.skc_v6_daddr);
	} else {
		return false;
	}
	fl.proto = BPF_CORE_READ(sk, sk_protocol);
	fl.sport = BPF_CORE_READ(sk, __sk_common.skc_num);
	fl.dport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	return trc_match(&fl, f_ifindex, f_netns ? BPF_CORE_READ(sk, __sk_common.skc_net.net, net_cookie) : 0);
}

static __always_inline void trc_sock(__u64 *a, __u32 calls)
{
	int ret = (int)a[1];

	if (ret <= 0 || !trc_sock_match((void *)a[0]))
		return;
	trc_count(calls, 1);
	trc_count(calls + 1, ret);
}

static __always_inline void trc_send(__u64 *a) { trc_sock(a, EZ_TRC_C_SOCK_SEND); }
static __always_inline void trc_recvmsg(__u64 *a) { trc_sock(a, EZ_TRC_C_SOCK_RECV); }

TRC_TP(sock_send_length, trc_send)
TRC_TP(sock_recv_length, trc_recvmsg)
