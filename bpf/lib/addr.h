/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * 16-byte addresses as map keys use them: IPv6, with IPv4 stored v4-mapped
 * (::ffff:a.b.c.d) so an AF_INET socket and an AF_INET6 dual-stack one
 * build byte-identical keys.
 */
#ifndef EZ_LIB_ADDR_H
#define EZ_LIB_ADDR_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define EZ_AF_INET 2
#define EZ_AF_INET6 10

/* ::ffff:a.b.c.d, the IPv4 address given in network byte order. */
static __always_inline void ip_from_v4(__u8 *dst, __u32 addr_be)
{
	__u32 *d = (__u32 *)dst;

	d[0] = 0;
	d[1] = 0;
	d[2] = bpf_htonl(0x0000ffff);
	d[3] = addr_be;
}

static __always_inline void ip_from_v6(__u8 *dst, const __u32 *src)
{
	__u32 *d = (__u32 *)dst;

	d[0] = src[0];
	d[1] = src[1];
	d[2] = src[2];
	d[3] = src[3];
}

static __always_inline bool ip_is_v4mapped(const __u8 *ip)
{
	const __u32 *a = (const __u32 *)ip;

	return !a[0] && !a[1] && a[2] == bpf_htonl(0x0000ffff);
}

/* 127.0.0.0/8 (v4-mapped) or ::1. */
static __always_inline bool ip_is_loopback(const __u8 *ip)
{
	const __u32 *a = (const __u32 *)ip;

	if (a[0] || a[1])
		return false;
	if (a[2] == bpf_htonl(0x0000ffff))
		return ip[12] == 127;
	return a[2] == 0 && a[3] == bpf_htonl(1);
}

#endif
