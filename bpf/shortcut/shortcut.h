/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared by the socket-shortcut datapath and the Go agent. bpf2go
 * generates the Go side from this file: edit it here only. Fixed-width
 * fields, widest first, explicit padding, so both compilers agree.
 */
#ifndef EZ_SHORTCUT_H
#define EZ_SHORTCUT_H

#include "vmlinux.h"

/*
 * Canonical identity of one TCP connection, named from the client (active
 * opener) side, after NAT. Addresses are IPv6; IPv4 is stored v4-mapped
 * (::ffff:a.b.c.d) so an AF_INET client and an AF_INET6 dual-stack listener
 * build byte-identical keys. Ports are in host byte order. netns is the
 * network-namespace cookie when either address is loopback (such tuples
 * repeat in every namespace), 0 otherwise.
 */
struct ez_conn_key {
	__u64 netns;
	__u8 client_ip[16];
	__u8 server_ip[16];
	__u16 client_port;
	__u16 server_port;
	__u32 _pad;
};

/*
 * A socket's two ends as sockops reports them (struct bpf_sock_ops fields);
 * shortcut/key.h turns them into a key. Addresses in network order.
 */
struct ez_sock_ends {
	__u32 local_ip6[4];
	__u32 remote_ip6[4];
	__u32 local_ip4;
	__u32 remote_ip4;
	__u32 local_port;	/* host order */
	__u32 remote_port;	/* network order, in the upper 16 bits on little endian */
	__u32 family;		/* AF_INET or AF_INET6 */
};

/*
 * Pairing record of one connection, shared by its two ends until the client
 * has learnt the outcome. Created when a managed listener sees the SYN;
 * removed when the server finds no managed client, when the client reads the
 * outcome (its first sendmsg), or when the client closes.
 *
 * The key names the record; the handshake proves it (struct
 * ez_pair_proof): a socket may claim or complete the record only when its
 * own initial sequence numbers are the handshake's (sockops.h). An address
 * alone pairs nothing.
 */
struct ez_pair {
	__u64 created_ns;	/* bpf_ktime_get_ns() when the listener saw the SYN */
	__u64 client_cookie;	/* socket cookie of the managed client that claimed it */
	__u64 server_cookie;	/* socket cookie of the accepted socket, once paired */
	struct ez_conn_key alias; /* the client's (pre-NAT) key, when has_alias */
	__u32 state;		/* enum ez_pair_state */
	__u32 has_alias;
	__u32 client_rx_bound;	/* the client's bound on unread bytes (struct ez_unread), set when it claims */
	__u32 proven;		/* 1: the listener's SYN-ACK proved it (in scope; its ISNs in ez_sc_proofs) */
};

/*
 * The handshake that proves a record (ez_sc_proofs, by the record's key):
 * its initial sequence numbers as the listener's SYN-ACK carries them. A
 * map of its own, LRU, so that struct ez_pair keeps the layout pinned
 * datapaths have (an upgrade in place); a proof evicted or left over from
 * an earlier record of the key proves nothing: only a record with proven
 * set reads it, and its SYN-ACK wrote it before setting proven.
 */
struct ez_pair_proof {
	__u32 client_isn;	/* the client's ISN (the SYN-ACK's ack - 1) */
	__u32 server_isn;	/* the listener's ISN (the SYN-ACK's seq) */
	__u32 unproven;		/* sockets refused for other ISNs: EZ_PAIR_MAX_UNPROVEN make the record AMBIGUOUS */
	__u32 _pad;
};

/*
 * Claims of a record by sockets with other ISNs before it stops pairing: a
 * guess of both ISNs (64 bits) gets this many tries per handshake.
 */
#define EZ_PAIR_MAX_UNPROVEN 4

/*
 * Finds a listener's record from its SYN-ACK, where the program sees only the
 * listener socket (cgroup_skb runs with sk_to_full_sk), not the request
 * socket: within one namespace, the client's ip:port and the listening port
 * name one handshake. Value: struct ez_alias pointing at the record.
 */
struct ez_syn_index {
	__u64 netns;
	__u8 client_ip[16];
	__u16 client_port;
	__u16 listener_port;
	__u32 _pad;
};

/*
 * The listener's view differs from the wire: NAT in the server's namespace
 * (Istio's inbound REDIRECT to 15006) rewrote the SYN. Keyed by the tuple the
 * client knows; points at the record the listener registered. Written when
 * the SYN-ACK leaves (after the reverse NAT), before the client can claim.
 */
struct ez_alias {
	__u64 created_ns;
	struct ez_conn_key target;
};

enum ez_pair_state {
	EZ_PAIR_SYN = 1,	/* registered by the listener, no client yet */
	EZ_PAIR_CLAIMING = 2,	/* a client is writing its cookie */
	EZ_PAIR_CLIENT = 3,	/* claimed by exactly one managed client, which is enrolled */
	EZ_PAIR_PAIRED = 4,	/* server enrolled too: both directions redirected for life */
	EZ_PAIR_KERNEL = 5,	/* decided for the kernel path for life; nobody enrolled */
	EZ_PAIR_AMBIGUOUS = 6,	/* two handshakes or clients for one key: never pair */
};

/* Per-socket state (BPF_MAP_TYPE_SK_STORAGE): freed by the kernel with the socket. */
struct ez_sock {
	__u64 self_cookie;
	__u64 peer_cookie;
	__u64 syn_ns;		/* first SYN seen on egress (clients) */
	__u64 tx_msgs;		/* messages this socket redirected to its peer */
	__u64 tx_bytes;
	struct ez_conn_key key;
	__u32 state;		/* enum ez_sock_state */
	__u32 flags;		/* enum ez_sock_flags */
};

enum ez_sock_state {
	EZ_SOCK_SEEN = 0,	/* storage exists; not in the sockhash */
	EZ_SOCK_WAITING = 1,	/* client in the sockhash; outcome in its ez_pair record */
	EZ_SOCK_PAIRED = 2,	/* both ends in the sockhash: every byte is redirected */
	EZ_SOCK_KERNEL = 3,	/* decided for the kernel path for the connection's life */
	EZ_SOCK_LEFT = 4,	/* was paired; the connection switched to the kernel path and this end left the sockhash */
	EZ_SOCK_ADOPT_ARMED = 5, /* established before the agent; confirmed quiet for adoption, tripwire on, not in the sockhash */
	EZ_SOCK_ADOPT_IN = 6,	/* being adopted: in the sockhash, its connection's ez_adopt record not PAIRED yet */
};

enum ez_sock_flags {
	EZ_F_SYN_SEEN = 1,	/* key holds the post-NAT tuple of the SYN */
	EZ_F_SYN_DATA = 2,	/* data rode on the SYN (TCP Fast Open) */
	EZ_F_CLIENT = 4,
	EZ_F_SERVER = 8,
	EZ_F_UNREAD_REF = 16,	/* holds a reference on its connection's ez_unread record */
	EZ_F_ADOPTED = 32,	/* paired by adoption (shortcut/adopt.h), not at its handshake */
	EZ_F_CLOSE_RESET = 64,	/* closed with redirected bytes unread: its FIN goes out as RST (shortcut/closereset.h) */
	EZ_F_TX_OPEN = 128,	/* this end's direction redirects: its receiver reads with recvmsg and read every kernel-path byte (shortcut/splice.h) */
	EZ_F_TX_REGATED = 256,	/* this end's direction went back to the kernel path under TCP memory pressure: it opens again only by the sequence proof (skmsg.h tx_mem_pressure) */
};

/*
 * How a paired socket reads (shortcut/splice.h), value of ez_sc_rx by the
 * socket's cookie. Its peer redirects to it only once it is a READER that
 * has read every byte the kernel path carried to it (copied_seq equals the
 * peer's write_seq); a SPLICER never gets a redirected byte again.
 */
struct ez_rx {
	__u64 unread_key;	/* its connection's ez_sc_unreads key (0: not known) */
	__u32 copied_seq;	/* its tcp_sock copied_seq after its last recvmsg */
	__u32 flags;		/* enum ez_rx_flag */
};

enum ez_rx_flag {
	EZ_RX_READER = 1,	/* returned data from tcp_bpf_recvmsg */
	EZ_RX_SPLICER = 2,	/* spliced, or its process spliced from a TCP socket: kernel path for good */
	EZ_RX_DIR1 = 4,		/* it receives direction 1 (it is the client) */
};

/*
 * Redirected bytes a paired connection's receivers have not read yet
 * (shortcut/unread.h), shared by both ends: HASH ez_sc_unreads keyed by the
 * client's socket cookie. Direction 0 is client to server (the server reads
 * it), 1 server to client. Created when the connection pairs (refs = 2);
 * each end drops its reference when it reaches TCP_CLOSE, the last removes it.
 */
struct ez_unread {
	__s64 unread[2];	/* redirected in direction d, not yet read by its receiver */
	__u32 bound[2];		/* most unread bytes direction d may hold */
	__u32 switched;		/* 1: the connection left the shortcut for good (never cleared) */
	__u32 refs;		/* ends still holding the record */
};

/*
 * Selection: which connections may be accelerated. Flags are a read-only
 * global set before load (ez_cfg_flags); rules live in two maps. A
 * connection is selected when its server port and both its addresses pass.
 */
enum ez_cfg_flag {
	EZ_CFG_NO_IPV6 = 1,		/* only IPv4 (and v4-mapped) connections */
	EZ_CFG_PORT_ALLOWLIST = 2,	/* only server ports with an INCLUDE rule */
	EZ_CFG_CIDR_ALLOWLIST = 4,	/* only addresses inside an INCLUDE prefix */
	EZ_CFG_CGROUP_FILTER = 8,	/* only sockets of cgroups in ez_sc_cgroups (Kubernetes mode) */
	EZ_CFG_RX_GAUGE = 16,		/* reads are not counted (neither read counter, recv.h): the bound gauges the receiver (unread.h) */
	EZ_CFG_KERNEL_BP = 32,		/* the kernel makes an ingress redirect's sender wait (kernel/patches): the bound gets EZ_KERNEL_BP_SLACK */
	EZ_CFG_NAT_TC = 64,		/* ez_sc_close_reset learns the node's NAT at SYN-ACKs (nat.h): no NAT hook is attached */
};

/*
 * With the kernel's ingress backpressure (EZ_CFG_KERNEL_BP) a sender waits
 * while its receiver's psock holds more than the receiver's sk_rcvbuf, tested
 * before each sendmsg chunk, so a receiver holds at most sk_rcvbuf plus one
 * chunk (tcp_bpf_sendmsg: MAX_MSG_FRAGS page frags of up to 32 KiB, 544 KiB);
 * the kernel grows sk_rcvbuf as autotuning does, up to tcp_rmem[2], which
 * is then the bound of a receiver without SO_RCVBUF (unread.h). The bound
 * only switches a connection the kernel failed to hold.
 */
#define EZ_KERNEL_BP_SLACK (1U << 20)

/*
 * A selected cgroup (a pod's cgroup in Kubernetes mode), value of ez_sc_cgroups
 * by cgroup id (the cgroup directory's inode number). The agent inserts and
 * deletes entries; BPF only counts.
 */
struct ez_cgroup {
	__u64 enrolled;		/* sockets of this cgroup enrolled in the sockhash */
};

enum ez_rule {
	EZ_RULE_INCLUDE = 1,
	EZ_RULE_EXCLUDE = 2,
};

/* LPM key of ez_sc_cidr_rules: IPv4 prefixes are stored v4-mapped (prefixlen + 96). */
struct ez_cidr_key {
	__u32 prefixlen;
	__u8 ip[16];
};

/*
 * The connection index (shortcut/index.h): HASH ez_sc_index, socket cookie ->
 * struct ez_conn_index, what the listing needs of an enrolled end that
 * userspace can read with plain map lookups (no map-element iterator, no
 * setns). Written when an end enters the sockhash, deleted at its TCP_CLOSE
 * or when it settles on the kernel path; an end is listed only while its
 * connection's ez_sc_unreads record exists (both ends paired, not closed).
 */
struct ez_conn_index {
	__u64 peer_cookie;	/* the other end's cookie (0: a client before it settled; its server's entry names it) */
	__u64 netns_cookie;	/* cookie of the socket's network namespace */
	__u64 cgroup_id;	/* the socket's cgroup v2 id (its pod's cgroup) */
	__u64 created_ns;	/* when written (CLOCK_MONOTONIC): the agent prunes entries never paired */
	struct ez_conn_key key;	/* client and server ip:port (client's side, after NAT) */
	__u32 netns_ino;	/* inode of the network namespace */
	__u32 flags;		/* enum ez_sock_flags: EZ_F_CLIENT or EZ_F_SERVER, and EZ_F_ADOPTED */
};

/*
 * One accelerated socket as the connections iterator (shortcut/iter.h) emits
 * it with bpf_seq_write: fixed width, read back record by record by the agent.
 */
struct ez_conn_record {
	__u64 cookie;		/* this socket's cookie */
	__u64 peer_cookie;	/* the other end's cookie */
	__u64 netns_cookie;	/* cookie of the socket's network namespace */
	__u64 tx_msgs;		/* messages this socket redirected to its peer */
	__u64 tx_bytes;
	struct ez_conn_key key;	/* client and server ip:port (client's side, after NAT) */
	__u32 netns_ino;	/* inode of the network namespace (as in /proc/PID/ns/net) */
	__u32 flags;		/* enum ez_sock_flags: EZ_F_CLIENT or EZ_F_SERVER, and EZ_F_ADOPTED */
	__u32 state;		/* enum ez_sock_state */
	__u32 tcp_state;	/* the socket's TCP state (BPF_TCP_*) */
	__s64 rx_unread;	/* bytes redirected to this socket it has not read */
	__u32 rx_bound;		/* the bound on rx_unread */
	__u32 switched;		/* the connection switched to the kernel path (backpressure, half-close) */
	__u32 _pad;
	__u64 cgroup_id;	/* the socket's cgroup v2 id (its pod's cgroup) */
};

/*
 * Adoption of a connection established before the agent (shortcut/adopt.h):
 * one record per connection in ez_sc_adopts, keyed by the client's (role 0)
 * socket cookie, written by the agent (CANDIDATE) and advanced by BPF with
 * cmpxchg only. ez_sc_adopt_socks maps each end's cookie to its record.
 */
struct ez_adopt {
	__u64 cookie[2];	/* role 0: client (sends direction 0), role 1: server */
	struct ez_conn_key key;	/* client and server ip:port after NAT, as the agent matched them */
	__u32 state;		/* enum ez_adopt_state */
	__u32 confirmed;	/* bit per role: that end was quiet under its lock, tripwire on */
	__u32 inserted;		/* bit per role: that end is in the sockhash */
	__u32 bound[2];		/* each role's bound as a receiver (struct ez_unread), set at its confirm */
	__u32 reason;		/* the enum ez_adopt_counter an abort was counted under */
};

struct ez_adopt_ref {
	__u64 conn;		/* key of the ez_sc_adopts record: the client's cookie */
	__u32 role;		/* 0 client, 1 server */
	__u32 _pad;
};

enum ez_adopt_state {
	EZ_ADOPT_CANDIDATE = 1,	/* matched by the agent */
	EZ_ADOPT_CONFIRMED = 2,	/* both ends quiet under their own lock, tripwires on */
	EZ_ADOPT_ONE_IN = 3,	/* one end in the sockhash */
	EZ_ADOPT_PAIRED = 4,	/* both in, activated: redirected like a handshake pair */
	EZ_ADOPT_ABORTED = 5,	/* given up this round; its ends are handed back */
};

/* Why a socket cannot be adopted now (struct ez_adopt_sock.busy); 0: quiet. */
enum ez_adopt_busy {
	EZ_AB_UNACKED = 1,	/* sent bytes not acknowledged yet (write_seq != snd_una) */
	EZ_AB_UNREAD = 2,	/* received bytes the application has not read */
	EZ_AB_QUEUED = 4,	/* out-of-order queue or backlog not empty */
	EZ_AB_SLEEPER = 8,	/* a thread sleeps on the socket (blocking recv/send, poll) or waits for its lock */
	EZ_AB_CLOSING = 16,	/* shutdown, error or urgent data */
	EZ_AB_UNSUPPORTED = 32,	/* another sockmap/ULP user, TCP repair, MD5 */
	EZ_AB_SACK = 64,	/* 3 or more SACK/D-SACK blocks to send: with timestamps they fill the option space the tripwire needs */
};

/* One socket as ez_sc_adopt_scan emits it: established sockets and listeners of one netns. */
struct ez_adopt_sock {
	__u64 cookie;
	__u64 netns_cookie;
	__u64 cgroup_id;
	__u8 local_ip[16];	/* v4-mapped for IPv4 */
	__u8 remote_ip[16];
	__u32 netns_ino;
	__u32 tcp_state;	/* BPF_TCP_ESTABLISHED or BPF_TCP_LISTEN */
	__u16 local_port;	/* host order */
	__u16 remote_port;
	__u32 busy;		/* enum ez_adopt_busy bits */
	__u32 snd_nxt;		/* next sequence number this end sends */
	__u32 rcv_nxt;		/* next sequence number it expects */
	__u32 state;		/* enum ez_sock_state of its sk_storage (0 without) */
	__u32 _pad;
};

/* Per-CPU counters of adoption (ez_sc_adopt_counters). The agent adds the ones it decides. */
enum ez_adopt_counter {
	EZ_A_ROUNDS = 0,	/* adoption rounds run (agent) */
	EZ_A_ADOPTED,		/* connections adopted: both ends paired */
	EZ_A_SKIP_BUSY,		/* bytes in flight or queued, a thread in a socket call, or data sent during the round */
	EZ_A_SKIP_NO_PEER,	/* the other end is not a socket in a managed cgroup of this node (agent) */
	EZ_A_SKIP_NAT_UNKNOWN,	/* a local socket matches by sequence numbers, but no tuple or conntrack entry links them (agent) */
	EZ_A_SKIP_EXCLUDED,	/* selection rules or scope */
	EZ_A_SKIP_AMBIGUOUS,	/* two candidates for one end, or neither end is a listener's (agent) */
	EZ_A_SKIP_UNSUPPORTED,	/* another sockmap/ULP user, repair, MD5, closing, or a failed insert */
	EZ_A_LATE_STACK,	/* adopted connections switched to the kernel path: a send that raced the insert took the stack */
	EZ_A_SKIP_UNCOVERED,	/* an end's network namespace does not carry the RST on close yet (ez_covered_only) */
	EZ_A_MAX,
};

/* Slots of the ez_sc_control array. */
enum ez_control {
	EZ_CTL_DRAINING = 0,	/* uninstall: stop redirecting, hand sockets back */
	EZ_CTL_RECV_OWNER = 1,	/* ez_cfg_instance of the one ez_sc_recv that counts reads */
	EZ_CTL_MAX,
};

/*
 * ez_sc_release and ez_sc_release_switched (shortcut/release.h) are tc programs the
 * agent runs through BPF_PROG_TEST_RUN, once per socket: the input packet
 * carries the socket's cookie at EZ_RELEASE_COOKIE_OFF, the return value is
 * an enum ez_release_result.
 */
enum ez_release_input {
	EZ_RELEASE_COOKIE_OFF = 14,	/* after an Ethernet header (test_run needs one) */
	EZ_RELEASE_INPUT_LEN = 22,
};

enum ez_release_result {
	EZ_REL_GONE = 0,	/* not in the sockhash (closed, or it left before) */
	EZ_REL_RELEASED = 1,	/* removed from the sockhash now */
	EZ_REL_WAIT = 2,	/* bytes redirected to it are unread: run again later */
	EZ_REL_KEEP = 3,	/* stays: not switched (ez_sc_release_switched) */
};

/* Per-CPU counters (BPF_MAP_TYPE_PERCPU_ARRAY indexed by this enum). */
enum ez_counter {
	EZ_C_SOCKETS_ENROLLED = 0,	/* sockets inserted into the sockhash */
	EZ_C_PAIRS,			/* connections with both directions redirected */
	EZ_C_MSGS_REDIRECTED,
	EZ_C_BYTES_REDIRECTED,
	EZ_C_HANDSHAKES,		/* SYNs registered by listeners in scope, proven by their SYN-ACK */
	EZ_C_FB_NO_LOCAL_PEER,		/* peer off-node or outside the managed cgroups */
	EZ_C_FB_AMBIGUOUS,		/* two candidates for one key */
	EZ_C_FB_MAP_FULL,
	EZ_C_FB_EBUSY,			/* socket owned by another sockmap/ULP user */
	EZ_C_FB_EXCLUDED,		/* selection rules */
	EZ_C_FB_EARLY_DATA,		/* client wrote before its server was paired */
	EZ_C_FB_SYN_DATA,		/* TCP Fast Open */
	EZ_C_FB_PEER_GONE,		/* redirect target closed: message left on the kernel path */
	EZ_C_FB_NO_STORAGE,		/* sk_storage allocation failed */
	EZ_C_FB_OTHER,			/* any other failed insert */
	EZ_C_SOCKETS_RELEASED,		/* enrolled sockets handed back to the kernel path */
	EZ_C_NAT_ALIASES,		/* handshakes NAT-ed in the server's namespace, learnt from the SYN-ACK */
	EZ_C_FB_BACKPRESSURE,		/* a receiver fell a bound behind: the connection switched to the kernel path */
	EZ_C_DELETE_FAILED,		/* a pairing or unread record could not be deleted (left behind) */
	EZ_C_GAUGE_UNKNOWN,		/* gauge mode: the receiver's socket was not found at a send (closed: switched as peer_gone) */
	EZ_C_FB_HALF_CLOSE,		/* an end's own shutdown(SHUT_WR): the connection switched to the kernel path (sockops.h on_half_close) */
	EZ_C_FB_UNPROVEN,		/* a record for this tuple holds another handshake's ISNs: not this socket's */
	EZ_C_RX_GATED,			/* messages sent on the kernel path: their receiver had not read with recvmsg yet, or not every kernel-path byte */
	EZ_C_RX_OPENED,			/* directions that moved from the kernel path to the shortcut (shortcut/splice.h) */
	EZ_C_FB_SPLICE,			/* a receiver spliced: the connection switched to the kernel path */
	EZ_C_SPLICE_STRANDED,		/* splices of a socket that held redirected bytes unread (only recvmsg reads them) */
	EZ_C_FB_EVICTED,		/* a pairing record evicted (LRU) or reused while its handshake was in flight */
	EZ_C_RX_REGATED,		/* directions back on the kernel path under node TCP memory pressure (skmsg.h tx_mem_pressure) */
	EZ_C_FB_UNCOVERED,		/* an end's network namespace did not carry the RST on close yet (ez_covered_only, coverage.h) */
	EZ_C_MAX,
};

/*
 * A FIN to send as RST (ez_sc_resets, shortcut/closereset.h): the packet as it
 * goes on the wire, after NAT. Addresses as lib/addr.h, ports and sequence
 * number in host order.
 */
struct ez_reset_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u32 seq;
};

/* Per-CPU counters of the RST on close (ez_sc_reset_counters). */
enum ez_reset_counter {
	EZ_R_ARMED = 0,		/* FINs of sockets closed with redirected bytes unread */
	EZ_R_SENT,		/* of those, rewritten to RST on a device */
	EZ_R_EXPIRED,		/* armed entries found too old to use */
	EZ_R_UNCOVERED,		/* sockets enrolled while their network namespace's loopback did not carry the program (shortcut/coverage.h) */
	EZ_R_MAX,
};

#endif
