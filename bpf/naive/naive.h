/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Types shared by the lab's naive sockmap (bpf/naive/naive.bpf.c) and its Go
 * loader (lab/naivesockmap). bpf2go generates the Go side from this file.
 * Fixed-width fields, widest first, no holes. IPv4 only, as the lab.
 */
#ifndef EZ_NAIVE_H
#define EZ_NAIVE_H

#include "vmlinux.h"

/* A socket's 4-tuple, from its own side: addresses in network order,
 * ports in host order. */
struct ez_naive_tuple {
	__u32 local_ip4;
	__u32 remote_ip4;
	__u16 local_port;
	__u16 remote_port;
};

/*
 * One end of a connection, the client's (the active opener's local end):
 * REDIRECT rewrites only the destination, so the accepting socket's remote
 * end is still the client's. role tells the two sockets that carry it
 * apart.
 */
struct ez_naive_end {
	__u32 ip4;
	__u16 port;
	__u16 role; /* enum ez_naive_role */
};

enum ez_naive_role {
	EZ_NAIVE_ACTIVE = 1,  /* connect()ed: the end is its local one */
	EZ_NAIVE_PASSIVE = 2, /* accept()ed: the end is its remote one */
};

/* How many ports ez_naive_skip_ports holds. */
#define EZ_NAIVE_SKIP_MAX 8

/* Counters (a per-CPU array indexed by these). */
enum ez_naive_counter {
	EZ_NAIVE_C_INSERTED = 0,   /* sockets put into the sockhashes */
	EZ_NAIVE_C_INSERT_FAIL,    /* sockets a sockhash refused */
	EZ_NAIVE_C_BY_TUPLE,       /* messages redirected to the reversed tuple's socket */
	EZ_NAIVE_C_BY_CLIENT,      /* messages redirected to the peer found by the client end */
	EZ_NAIVE_C_PASS,           /* messages without a peer: the kernel path */
	EZ_NAIVE_C_SKIPPED,        /* sockets left out: a port in ez_naive_skip_ports */
	EZ_NAIVE_C_MAX,
};

#endif
