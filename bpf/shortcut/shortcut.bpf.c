// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket shortcut: sockops + sk_msg + SOCKHASH, with cgroup_skb egress for NAT and tp_btf for reads. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ez_sc_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_A_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ez_sc_adopt_counters SEC(".maps");

/* enum ez_cfg_flag bits; set by the agent on the spec before load. */
volatile const __u32 ez_cfg_flags = 0;

/* --max-unread, set before load; 0: per receiver (lib/bound.h). */
volatile const __u32 ez_cfg_max_unread = 0;

/* Tells this load's ez_sc_recv from an earlier install's while both are attached. */
volatile const __u32 ez_cfg_instance = 0;

/* Connections being counted, by client cookie. Sized to the sockhash / 2 by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not the bound */
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct ez_unread);
} ez_sc_unreads SEC(".maps");

/*
 * The gauge, for kernels without tp_btf/sock_recv_length (Linux 6.1: nothing
 * a BPF program can use fires after a psock read, tcp_bpf_recvmsg and
 * sk_msg_recvmsg have no tracepoint). bpf_tcp_ingress adds every redirected
 * byte to the receiver's sk_rmem_alloc and __sk_msg_recvmsg subtracts what
 * the reader copies (6.1 to 6.18): while a connection is paired no segment
 * carries data to it (the server pairs with nothing received), so the
 * receiver's sk_rmem_alloc is exactly its redirected, unread bytes. The
 * sender reads it before each redirect. Each enrolled end registers its
 * struct sock here (sockops; storing a kernel address needs CAP_PERFMON);
 * the sender checks the cookie at that address (TCP sockets are
 * SLAB_TYPESAFE_BY_RCU: a stale address reads another socket, never freed
 * memory). No reads are counted in this mode, so a direction that received
 * redirected bytes never proves they were read: its ends stay in the
 * sockhash after a switch (the kernel path's bytes queue behind the psock's,
 * tcp_bpf_recvmsg reads the psock first), and RST on close asks the closing
 * socket's own psock queue instead (closereset.h).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, __u64);	/* socket cookie */
	__type(value, __u64);	/* its struct sock */
} ez_sc_rx_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ez_reset_key);
	__type(value, __u64); /* when it was armed (ns) */
} ez_sc_resets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EZ_R_MAX);
	__type(key, __u32);
	__type(value, __u64);
} ez_sc_reset_counters SEC(".maps");

/* Network namespaces whose loopback carries ez_sc_close_reset (the agent
 * keeps it, shortcut/coverage.h); not pinned: every load fills its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);   /* netns cookie */
	__type(value, __u64); /* 1 */
} ez_sc_netns_covered SEC(".maps");

/* Namespaces seen at a handshake and not in ez_sc_netns_covered: the
 * agent's request queue (LRU: a flood of namespaces evicts, never grows). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);   /* netns cookie */
	__type(value, __u64); /* when first asked (ns) */
} ez_sc_netns_wanted SEC(".maps");

/* The agent's network namespace (set before load): the tracing programs
 * below run for every namespace and learn only from packets its devices
 * carry, as ez_sc_nat's link sees only its hooks. */
volatile const __u64 ez_cfg_nat_netns = 0;

/* Enrolled ends by cookie, for the connection listing (shortcut/index.h).
 * Sized to the sockhash by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not the bound */
	__uint(max_entries, 131072);
	__type(key, __u64);	/* socket cookie */
	__type(value, struct ez_conn_index);
} ez_sc_index SEC(".maps");

/* Paired sockets by cookie: how each reads. LRU: an evicted entry makes its
 * peer's next message take the kernel path (no entry: not a reader) until
 * the socket reads again; the datapath deletes an end's entry at TCP_CLOSE. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 131072);
	__type(key, __u64);	/* socket cookie */
	__type(value, struct ez_rx);
} ez_sc_rx SEC(".maps");

/* Processes that spliced from a TCP socket, by tgid; value: the start time
 * of their group leader (a reused pid is another process). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} ez_sc_splicers SEC(".maps");

/* The syscall numbers of splice and sendfile on this architecture, set by
 * the agent before load (0: never matches). */
volatile const __u32 ez_cfg_nr_splice = 0;
volatile const __u32 ez_cfg_nr_sendfile = 0;

/* Pages of TCP memory the per-CPU caches may hold back from the global
 * count (possible CPUs x net.core.mem_pcpu_rsv), set by the agent before
 * load: shortcut/skmsg.h tx_mem_pressure. */
volatile const __u32 ez_cfg_mem_slack = 0;

/* Set by the agent for the last pass of an adoption round: whatever is not
 * PAIRED is aborted and handed back (a .bss variable, not pinned). */
volatile __u32 ez_adopt_finish = 0;

/* Set by the agent once ez_sc_netns_covered holds what it attached (a .bss
 * variable, not pinned): until then nothing is counted or asked. */
volatile __u32 ez_netns_coverage = 0;

/* Set by the agent right after load with --close-reset-devices=covered,
 * where the close reset runs: a socket enrols only in a covered namespace
 * (shortcut/coverage.h coverage_gate; not pinned, so each load sets it). */
volatile __u32 ez_covered_only = 0;

/* Helpers (headers): they use the maps above. */
#include "shortcut/control.h"
#include "shortcut/index.h"
#include "shortcut/egress.h"
#include "shortcut/nat.h"
#include "shortcut/unread.h"
#include "shortcut/splice.h"
#include "shortcut/coverage.h"
#include "shortcut/sockops.h"
#include "shortcut/skmsg.h"
#include "shortcut/release.h"
#include "shortcut/iter.h"
#include "shortcut/recv.h"
#include "shortcut/adopt.h"

/* Programs; their helpers are in shortcut/closereset.h. */

SEC("cgroup/sock_release")
int ez_sc_sock_release(struct bpf_sock *ctx)
{
	struct ez_unread *u;
	struct ez_sock *es;
	__u64 key;

	if (ctx->protocol != EZ_IPPROTO_TCP)
		return 1;
	es = bpf_sk_storage_get(&ez_sc_socks, ctx, 0, 0);
	if (!es || es->state != EZ_SOCK_PAIRED)
		return 1;
	if (rx_gauged(es)) {
		/* No reads are counted (unread.h, the gauge): ask the closing
		 * socket's own psock queue, through its registered address
		 * (cgroup/sock has no bpf_skc_to_tcp_sock). Not its
		 * sk_rmem_alloc: a FIN segment queued and not read (the peer
		 * shut down, this end never read EOF) holds memory there, and
		 * plain TCP closes that with FIN. The psock is still there:
		 * sock_map_close runs after this hook. */
		struct sock *sk = rx_sock(es->self_cookie);

		if (sk && !psock_empty(sk))
			es->flags |= EZ_F_CLOSE_RESET;
		return 1;
	}
	key = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &key);
	if (u && u->unread[rx_dir(es) & 1] > 0)
		es->flags |= EZ_F_CLOSE_RESET;
	return 1;
}

/* Attached with tcx at ingress and egress (one program serves both). */
SEC("tc")
int ez_sc_close_reset(struct __sk_buff *skb)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, EZ_RESET_ETH_HLEN);
	struct ez_reset_key k = {};
	struct ez_flow f = {};
	__u16 old_word, new_word;
	__u8 *b = (__u8 *)&old_word;
	__u64 *armed;
	__u32 seq;
	__u32 off;
	int q;

	/* Runs on every packet of the devices: anything but a plain FIN (or,
	 * learning the node's NAT here, a SYN-ACK) leaves after reading one
	 * byte (ez_tcp_flags_quick). */
	q = ez_tcp_flags_quick(skb, EZ_RESET_ETH_HLEN);
	if (q == EZ_QUICK_NOT_TCP || (q >= 0 && !plain_fin_flags(q) && !nat_synack_flags(q)))
		return TCX_NEXT;
	if (ez_parse(&p, false, &f) || f.proto != EZ_IPPROTO_TCP)
		return TCX_NEXT;
	if ((f.flags & (EZ_FLOW_FRAG | EZ_FLOW_TCP)) == EZ_FLOW_TCP && nat_synack_flags(f.tcp_flags)) {
		nat_learn_synack(skb, &f);
		return TCX_NEXT;
	}
	if (!is_plain_fin(&f))
		return TCX_NEXT;
	if (ez_pkt_read(&p, false, f.l4off + 4, &seq, sizeof(seq)))
		return TCX_NEXT;
	reset_key(&k, &f, bpf_ntohl(seq));
	armed = bpf_map_lookup_elem(&ez_sc_resets, &k);
	if (!armed)
		return TCX_NEXT;
	if (bpf_ktime_get_ns() - *armed > EZ_RESET_TTL_NS) {
		bpf_map_delete_elem(&ez_sc_resets, &k);
		reset_count(EZ_R_EXPIRED);
		return TCX_NEXT;
	}
	off = EZ_RESET_ETH_HLEN + f.l4off;
	if (ez_pkt_read(&p, false, f.l4off + EZ_TCP_OFF_FLAGS, &old_word, sizeof(old_word)))
		return TCX_NEXT;
	new_word = old_word;
	/* RST|ACK as tcp_send_active_reset sends it: FIN and PSH off, ACK kept. */
	((__u8 *)&new_word)[1] = (b[1] & ~(EZ_TCP_FIN | EZ_TCP_PSH)) | EZ_TCP_RST;
	if (bpf_skb_store_bytes(skb, off + EZ_TCP_OFF_FLAGS, &new_word, sizeof(new_word), 0))
		return TCX_NEXT;
	/* Not BPF_F_PSEUDO_HDR: with CHECKSUM_PARTIAL (lo, veth) the field holds
	 * only the pseudo-header sum and is left alone; otherwise it is updated. */
	if (bpf_l4_csum_replace(skb, off + EZ_TCP_OFF_CSUM, old_word, new_word, sizeof(new_word))) {
		bpf_skb_store_bytes(skb, off + EZ_TCP_OFF_FLAGS, &old_word, sizeof(old_word), 0);
		return TCX_NEXT; /* stays a FIN */
	}
	bpf_map_delete_elem(&ez_sc_resets, &k);
	reset_count(EZ_R_SENT);
	return TCX_NEXT;
}

/* Programs; their helpers are in shortcut/egress.h. */

SEC("cgroup_skb/egress")
int ez_sc_egress(struct __sk_buff *skb)
{
	struct ez_pkt p = ez_pkt_of_skb(skb, 0); /* cgroup_skb: offset 0 is the network header */
	struct ez_flow f = {};
	struct ez_syn syn = {};
	struct bpf_sock *sk;
	struct ez_sock *es;
	int q;

	/* Runs on every packet of a managed socket: anything but a SYN or a
	 * plain FIN leaves after reading one byte (ez_tcp_flags_quick);
	 * parse_syn and arm_close_reset would reject it. */
	q = ez_tcp_flags_quick(skb, 0);
	if (q == EZ_QUICK_NOT_TCP || (q >= 0 && !(q & EZ_TCP_SYN) && !plain_fin_flags(q)))
		return 1;
	if (ez_parse(&p, false, &f))
		return 1;
	if (!parse_syn(&f, &syn)) {
		arm_close_reset(skb, &p, &f);
		return 1;
	}
	if (syn.ack) {
		on_synack(skb, &syn, &p, &f);
		return 1;
	}
	sk = skb->sk;
	if (!sk)
		return 1;
	sk = bpf_sk_fullsock(sk);
	if (!sk)
		return 1;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!es) {
		count(EZ_C_FB_NO_STORAGE);
		return 1;
	}
	/* A retransmitted SYN keeps the first timestamp: claims must be newer than it. */
	if (!es->syn_ns)
		es->syn_ns = bpf_ktime_get_ns();
	es->key = syn.key;
	es->flags |= EZ_F_SYN_SEEN | EZ_F_CLIENT;
	if (syn.payload)
		es->flags |= EZ_F_SYN_DATA;
	return 1;
}

/* Programs; their helpers are in shortcut/nat.h. */

SEC("netfilter")
int ez_sc_nat(struct bpf_nf_ctx *ctx)
{
	nat_learn(ctx->skb);
	return EZ_NF_ACCEPT;
}

SEC("tp_btf/net_dev_queue")
int BPF_PROG(ez_sc_nat_dev, struct sk_buff *skb)
{
	nat_learn_here(skb);
	return 0;
}

/* __nf_conntrack_confirm runs for an unconfirmed entry only (the inline
 * nf_conntrack_confirm checks first), in every namespace. A reply direction
 * or a template entry is not IP_CT_NEW, and nat_learn leaves. */
SEC("fentry/__nf_conntrack_confirm")
int BPF_PROG(ez_sc_nat_ct, struct sk_buff *skb)
{
	nat_learn_here(skb);
	return 0;
}

/* Programs; their helpers are in shortcut/splice.h. */

/*
 * Preferred where the host allows fentry: the entry of tcp_splice_read
 * itself, before it reads (inet_stream_ops.splice_read, reached by
 * splice(2), sendfile(2) with a socket in_fd through do_splice_direct, and
 * io_uring's IORING_OP_SPLICE alike). Its trampoline runs on splices of TCP
 * sockets only: no syscall pays for it.
 */
SEC("fentry/tcp_splice_read")
int BPF_PROG(ez_sc_splice_fe, struct socket *sock)
{
	struct sock *sk = BPF_CORE_READ(sock, sk);

	if (sk && BPF_CORE_READ(sk, sk_protocol) == IPPROTO_TCP)
		rx_spliced_sk(sk);
	return 0;
}

/* splice(fd_in, off_in, fd_out, off_out, len, flags), preferred: runs for
 * splice only (perf_syscall_enter tests the syscall's bit first). */
SEC("tracepoint/syscalls/sys_enter_splice")
int ez_sc_splice_tp(struct trace_event_raw_sys_enter *ctx)
{
	rx_spliced((long)ctx->args[0]);
	return 0;
}

/* sendfile(out_fd, in_fd, offset, count): a socket in_fd runs tcp_splice_read too. */
SEC("tracepoint/syscalls/sys_enter_sendfile64")
int ez_sc_sendfile_tp(struct trace_event_raw_sys_enter *ctx)
{
	rx_spliced((long)ctx->args[1]);
	return 0;
}

/*
 * The fallback where the agent cannot reach tracefs (the syscall events'
 * ids): every syscall's entry (raw tracepoint sys_enter, trace_sys_enter in
 * syscall_trace_enter): splice(fd_in, ...) and sendfile(out_fd, in_fd, ...)
 * before they run. Both turn on the syscall-tracepoint work
 * (SYSCALL_WORK_SYSCALL_TRACEPOINT) for every task; this one also runs the
 * program for every syscall (docs/benchmarks.md: about three times the
 * event's cost per syscall). Compat (32-bit) syscalls have other numbers
 * and registers: not seen.
 */
SEC("raw_tp/sys_enter")
int ez_sc_splice(struct bpf_raw_tracepoint_args *ctx)
{
	long id = (long)ctx->args[1];

	if (id == ez_cfg_nr_splice && id)
		rx_spliced(syscall_arg((void *)ctx->args[0], 0));
	else if (id == ez_cfg_nr_sendfile && id)
		rx_spliced(syscall_arg((void *)ctx->args[0], 1));
	return 0;
}

/* Programs; their helpers are in shortcut/adopt.h. */

/*
 * iter/tcp, run by the agent in each network namespace (the iterator sees
 * the namespace it was opened in): one struct ez_adopt_sock per established
 * socket and listener under an ez_sc_sockops attachment. Read-only.
 */
SEC("iter/tcp")
int ez_sc_adopt_scan(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct ez_adopt_sock rec = {};
	struct tcp_sock *tp;
	struct ez_sock *es;
	struct sock *sk;
	struct net *net;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	sk = (struct sock *)tp;
	rec.tcp_state = sk->__sk_common.skc_state;
	if (rec.tcp_state != EZ_ADOPT_TCP_ESTABLISHED && rec.tcp_state != EZ_ADOPT_TCP_LISTEN)
		return 0;
	if (!adopt_hooked(tp))
		return 0;
	rec.cookie = bpf_get_socket_cookie(sk);
	rec.cgroup_id = adopt_cgroup_id(tp);
	net = BPF_CORE_READ(sk, __sk_common.skc_net.net);
	if (net) {
		rec.netns_cookie = BPF_CORE_READ(net, net_cookie);
		rec.netns_ino = BPF_CORE_READ(net, ns.inum);
	}
	if (sk->__sk_common.skc_family == EZ_AF_INET) {
		ip_from_v4(rec.local_ip, sk->__sk_common.skc_rcv_saddr);
		ip_from_v4(rec.remote_ip, sk->__sk_common.skc_daddr);
	} else {
		ip_from_v6(rec.local_ip, sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr32);
		ip_from_v6(rec.remote_ip, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr32);
	}
	rec.local_port = sk->__sk_common.skc_num;
	rec.remote_port = bpf_ntohs(sk->__sk_common.skc_dport);
	if (rec.tcp_state == EZ_ADOPT_TCP_ESTABLISHED) {
		rec.busy = adopt_busy(tp);
		rec.snd_nxt = tp->snd_nxt;
		rec.rcv_nxt = tp->rcv_nxt;
	}
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (es)
		rec.state = es->state;
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}

/*
 * iter/tcp, run by the agent in each network namespace, a few passes per
 * round: each pass moves every end with a record one step (confirm, insert,
 * settle) or hands it back (cleanup). One socket, locked, per visit.
 */
SEC("iter/tcp")
int ez_sc_adopt_step(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct ez_adopt_ref *ref;
	struct tcp_sock *tp;
	struct ez_adopt *a;
	struct ez_sock *es;
	struct sock *sk;
	__u64 cookie;
	__u32 role;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	sk = (struct sock *)tp;
	if (sk->__sk_common.skc_state != EZ_ADOPT_TCP_ESTABLISHED)
		return 0; /* left ESTABLISHED: sockops aborted and cleaned up */
	cookie = bpf_get_socket_cookie(sk);
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	ref = bpf_map_lookup_elem(&ez_sc_adopt_socks, &cookie);
	a = ref ? bpf_map_lookup_elem(&ez_sc_adopts, &ref->conn) : NULL;
	if (!a || !ref || a->cookie[ref->role & 1] != cookie) {
		if (es && adopting(es))
			adopt_cleanup(tp, es); /* an earlier round's, never finished */
		return 0;
	}
	role = ref->role & 1;
	if (ez_adopt_finish && a->state != EZ_ADOPT_PAIRED)
		adopt_abort(a, EZ_A_SKIP_BUSY);
	switch (a->state) {
	case EZ_ADOPT_CANDIDATE:
		adopt_confirm(tp, a, role, cookie);
		break;
	case EZ_ADOPT_CONFIRMED:
	case EZ_ADOPT_ONE_IN:
		adopt_insert(tp, es, a, role, cookie);
		break;
	case EZ_ADOPT_PAIRED:
		if (es)
			adopt_settle(es);
		break;
	default:
		if (es && adopting(es))
			adopt_cleanup(tp, es);
	}
	return 0;
}

/* Programs; their helpers are in shortcut/sockops.h. */

SEC("sockops")
int ez_sc_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_RWND_INIT:
		/* Called in tcp_openreq_init_rwin for every request socket, also
		 * with syncookies (TIMEOUT_INIT is not), before the SYN-ACK is
		 * sent; and for the client's own socket in tcp_connect_init. */
		coverage_ask(skops);
		if (!skops->is_fullsock)
			on_syn(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		on_client_established(skops);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		on_server_established(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		on_state_change(skops);
		break;
	case BPF_SOCK_OPS_PARSE_HDR_OPT_CB:
	case BPF_SOCK_OPS_HDR_OPT_LEN_CB:
		on_segment(skops);
		break;
	}
	return 1;
}

/* Programs; their helpers are in shortcut/skmsg.h. */

SEC("sk_msg")
int ez_sc_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *sk = msg->sk;
	__u32 size = msg->size;
	struct ez_unread *u;
	struct ez_sock *es;
	__u32 state, dir;
	__u64 key;
	__s64 total, bound;

	if (!sk)
		return SK_PASS;
	es = bpf_sk_storage_get(&ez_sc_socks, sk, 0, 0);
	if (!es)
		return SK_PASS;
	state = es->state;
	/* sendmsg holds the socket lock, as does the STATE_CB settle. */
	if (state == EZ_SOCK_WAITING) {
		if (early_data_waits(es)) {
			count(EZ_C_RX_GATED);
			return SK_PASS;
		}
		state = settle_client(es);
	}
	/* Adopted while this end was not activated yet: settle, or abort and
	 * take the kernel path (its tripwire then unlinks both ends before
	 * the segment leaves). */
	if (state == EZ_SOCK_ADOPT_IN) {
		struct ez_adopt *a = adopt_record(es);

		if (a && !adopt_abort(a, EZ_A_SKIP_BUSY))
			state = adopt_settle(es);
		if (state != EZ_SOCK_PAIRED)
			return SK_PASS;
	}
	if (state != EZ_SOCK_PAIRED)
		return SK_PASS;
	/* Uninstall: from this message on, this direction takes the kernel path.
	 * Everything redirected before is already in the peer's psock queue,
	 * which tcp_bpf_recvmsg reads before the TCP receive queue: no reorder.
	 * The flag never goes back, and sendmsg is serialised by the socket
	 * lock, so no later message of this socket is redirected. */
	if (draining())
		return SK_PASS;
	/* After shutdown(SHUT_WR), or once reset, the kernel path gives the
	 * application the EPIPE/ECONNRESET plain TCP gives: nothing is sent. */
	if (sk->state != BPF_TCP_ESTABLISHED && sk->state != BPF_TCP_CLOSE_WAIT)
		return SK_PASS;
	key = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &key);
	if (!u || u->switched)
		return SK_PASS;
	/* A receiver that has not read with recvmsg, or not every byte the
	 * kernel path brought it, or splices (shortcut/splice.h). */
	if (!tx_open(es, sk, u))
		return SK_PASS;
	if (tx_mem_pressure(sk, es, u, size))
		return SK_PASS;
	/* An adopted end with stack bytes not acknowledged: a send that raced
	 * the insert queued them and they may not have left yet (the tripwire
	 * sees them only when they do). Redirecting now could overtake them.
	 * A direction opened by tx_open's sequence proof needs no such check:
	 * its receiver read every stack byte this end wrote. */
	if ((es->flags & EZ_F_ADOPTED) && !(es->flags & EZ_F_TX_OPEN)) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);

		if (tp && tp->write_seq != tp->snd_una) {
			adopt_switch_late(u);
			return SK_PASS;
		}
	}
	/* Backpressure (shortcut/unread.h): add, then check `switched`. The
	 * receiver leaves the sockhash only after it read switched == 1 and then
	 * unread <= 0, so either we see switched here or our bytes are counted
	 * before it looks: it never leaves under a redirect of ours. A message
	 * that would pass the bound switches the connection for good and takes
	 * the kernel path itself; at most the bound stays unread. */
	dir = tx_dir(es) & 1;
	total = __sync_fetch_and_add(&u->unread[dir], size) + size;
	/* Gauge mode (unread.h, ez_sc_rx_socks): unread[dir] only grows; the
	 * bound is checked against what the receiver holds now. */
	if (rx_gauge()) {
		__s64 q = rx_queued(es->peer_cookie);

		if (q < 0) {
			/* The receiver left ez_sc_rx_socks at TCP_CLOSE (or was
			 * never found): a gone peer, as a failed redirect. */
			count(EZ_C_GAUGE_UNKNOWN);
			return peer_gone(u, dir, size);
		}
		total = q + size;
	}
	bound = u->bound[dir];
	if (ez_cfg_flags & EZ_CFG_KERNEL_BP)
		bound += EZ_KERNEL_BP_SLACK;
	if (u->switched || total > bound) {
		__sync_fetch_and_add(&u->unread[dir], -(__s64)size);
		if (__sync_val_compare_and_swap(&u->switched, 0, 1) == 0)
			count(EZ_C_FB_BACKPRESSURE);
		return SK_PASS;
	}
	/* The peer leaves the sockhash only when it is closed or reset (or
	 * switched, which we checked): there is no reader left to see an order,
	 * so the kernel path is the honest answer (it produces the RST/EPIPE
	 * plain TCP would). */
	if (bpf_msg_redirect_hash(msg, &ez_sc_sockets, &es->peer_cookie, BPF_F_INGRESS) != SK_PASS)
		return peer_gone(u, dir, size);
	es->tx_msgs++;
	es->tx_bytes += size;
	count(EZ_C_MSGS_REDIRECTED);
	count_add(EZ_C_BYTES_REDIRECTED, size);
	return SK_PASS;
}

/* Programs; their helpers are in shortcut/release.h. */

/*
 * Uninstall, after draining is set and in-flight redirects had time to land:
 * removes the socket from ez_sc_sockets once its psock queue is empty (removing
 * one with queued bytes would discard them, sk_psock_destroy).
 */
SEC("tc")
int ez_sc_release(struct __sk_buff *skb)
{
	struct bpf_sock *sk;
	struct tcp_sock *tp;
	__u64 cookie;
	int ret = EZ_REL_WAIT;

	sk = release_lookup(skb, &cookie);
	if (!sk)
		return EZ_REL_GONE;
	tp = bpf_skc_to_tcp_sock(sk);
	if (tp && psock_empty((struct sock *)tp)) {
		ret = EZ_REL_GONE;
		if (!bpf_map_delete_elem(&ez_sc_sockets, &cookie)) {
			count(EZ_C_SOCKETS_RELEASED);
			ret = EZ_REL_RELEASED;
		}
	}
	bpf_sk_release(sk);
	return ret;
}

/*
 * Run by the agent every ~100 ms after a switch: the backstop of sockops'
 * on_segment, which needs a segment in or out. Removes an end of a switched
 * connection once nothing redirected to it is unread (may_leave). A client
 * still waiting for its outcome is left to sockops, which settles it.
 */
SEC("tc")
int ez_sc_release_switched(struct __sk_buff *skb)
{
	struct bpf_sock *sk;
	struct tcp_sock *tp;
	struct ez_unread *u;
	struct ez_sock *es;
	__u64 ukey, cookie;
	int ret = EZ_REL_KEEP;

	sk = release_lookup(skb, &cookie);
	if (!sk)
		return EZ_REL_GONE;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		goto out;
	es = bpf_sk_storage_get(&ez_sc_socks, tp, 0, 0);
	if (!es || es->state != EZ_SOCK_PAIRED)
		goto out;
	ukey = unread_key(es);
	u = bpf_map_lookup_elem(&ez_sc_unreads, &ukey);
	if (!u || !u->switched)
		goto out;
	if (rx_gauged(es) && u->unread[rx_dir(es) & 1] > 0)
		goto out; /* gauge mode: stays until it closes (unread.h, ez_sc_rx_socks) */
	if (may_leave(u, es, (struct sock *)tp) && !bpf_map_delete_elem(&ez_sc_sockets, &cookie)) {
		es->state = EZ_SOCK_LEFT;
		count(EZ_C_SOCKETS_RELEASED);
		ret = EZ_REL_RELEASED;
		goto out;
	}
	ret = EZ_REL_WAIT; /* still holds unread bytes: the agent passes again */
out:
	bpf_sk_release(sk);
	return ret;
}

/* Programs; their helpers are in shortcut/iter.h. */

SEC("iter/tcp")
int ez_sc_conns(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct ez_conn_record rec = {};
	struct tcp_sock *tp;
	struct ez_sock *es;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0; /* request and time-wait sockets carry no storage */
	es = bpf_sk_storage_get(&ez_sc_socks, (struct sock *)tp, 0, 0);
	if (es && conn_record((struct sock *)tp, es, &rec))
		bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}

/* Every namespace at once; attached to ez_sc_socks (iter.h). */
SEC("iter/bpf_sk_storage_map")
int ez_sc_conns_all(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct ez_conn_record rec = {};
	struct ez_sock *es = ctx->value;
	struct sock *sk = ctx->sk;

	if (sk && es && conn_record(sk, es, &rec))
		bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}

/* Programs; their helpers are in shortcut/recv.h. */

SEC("fexit/tcp_bpf_recvmsg")
int BPF_PROG(ez_sc_recv_fx, struct sock *sk, struct msghdr *msg, size_t len, int flags, int *addr_len, int ret)
{
	recv_count(sk, ret, flags);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(ez_sc_recv, struct sock *sk, int ret, int flags)
{
	recv_count(sk, ret, flags);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that BTF, and so bpf2go, carries the enums the agent reads. */
const enum ez_counter ez_counter_enum __attribute__((unused));
const enum ez_pair_state ez_pair_state_enum __attribute__((unused));
const enum ez_sock_state ez_sock_state_enum __attribute__((unused));
const enum ez_cfg_flag ez_cfg_flag_enum __attribute__((unused));
const enum ez_rule ez_rule_enum __attribute__((unused));
const enum ez_control ez_control_enum __attribute__((unused));
const enum ez_reset_counter ez_reset_counter_enum __attribute__((unused));
const enum ez_release_input ez_release_input_enum __attribute__((unused));
const enum ez_release_result ez_release_result_enum __attribute__((unused));
const enum ez_rx_flag ez_rx_flag_enum __attribute__((unused));

/* Referenced so that BTF, and so bpf2go, carries the types of the helper
 * headers Go reads. */
const struct ez_conn_record ez_conn_record_type __attribute__((unused));
const enum ez_sock_flags ez_sock_flags_enum __attribute__((unused));
const struct ez_adopt_sock ez_adopt_sock_type __attribute__((unused));
const enum ez_adopt_state ez_adopt_state_enum __attribute__((unused));
const enum ez_adopt_busy ez_adopt_busy_enum __attribute__((unused));
const enum ez_adopt_counter ez_adopt_counter_enum __attribute__((unused));
