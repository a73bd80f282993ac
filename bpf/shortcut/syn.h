/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* A handshake packet read from a parsed one (egress.h; no maps: unit-tested alone). */
#ifndef EZ_SHORTCUT_SYN_H
#define EZ_SHORTCUT_SYN_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/addr.h"
#include "lib/parse.h"
#include "shortcut/key.h"

/* A handshake packet; key names the sender as client (true for a SYN). */
struct ez_syn {
	struct ez_conn_key key;
	__u32 payload;
	bool ack;
};

/*
 * Reads a TCP SYN or SYN-ACK from a parsed packet. Returns false for
 * anything else, fragments, and IPv6 with extension headers before TCP
 * (the socket stays unenrolled).
 */
static __always_inline bool parse_syn(const struct ez_flow *f, struct ez_syn *out)
{
	if (f->proto != EZ_IPPROTO_TCP)
		return false;
	if ((f->flags & (EZ_FLOW_FRAG | EZ_FLOW_TCP)) != EZ_FLOW_TCP || !(f->tcp_flags & EZ_TCP_SYN))
		return false;
	if (f->family == 4) {
		ip_from_v4(out->key.client_ip, f->saddr[0]);
		ip_from_v4(out->key.server_ip, f->daddr[0]);
	} else {
		ip_from_v6(out->key.client_ip, f->saddr);
		ip_from_v6(out->key.server_ip, f->daddr);
	}
	out->ack = !!(f->tcp_flags & EZ_TCP_ACK);
	out->key.client_port = f->sport;
	out->key.server_port = f->dport;
	out->payload = f->payload;
	return true;
}

#endif
