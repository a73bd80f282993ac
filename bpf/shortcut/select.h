/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Selection: may this connection be accelerated? (see struct ez_cidr_key) */
#ifndef EZ_SHORTCUT_SELECT_H
#define EZ_SHORTCUT_SELECT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "lib/addr.h"
#include "shortcut/shortcut.h"

static __always_inline bool ip_selected(const __u8 *ip)
{
	struct ez_cidr_key k = { .prefixlen = 128 };
	__u32 *rule;

	__builtin_memcpy(k.ip, ip, 16);
	rule = bpf_map_lookup_elem(&ez_sc_cidr_rules, &k);
	if (rule)
		return *rule == EZ_RULE_INCLUDE;
	return !(ez_cfg_flags & EZ_CFG_CIDR_ALLOWLIST);
}

static __always_inline bool key_selected(const struct ez_conn_key *k)
{
	__u32 port = k->server_port;
	__u32 *rule;

	if ((ez_cfg_flags & EZ_CFG_NO_IPV6) && !(ip_is_v4mapped(k->client_ip) && ip_is_v4mapped(k->server_ip)))
		return false;
	rule = bpf_map_lookup_elem(&ez_sc_port_rules, &port);
	if (rule && *rule == EZ_RULE_EXCLUDE)
		return false;
	if ((ez_cfg_flags & EZ_CFG_PORT_ALLOWLIST) && !(rule && *rule == EZ_RULE_INCLUDE))
		return false;
	return ip_selected(k->client_ip) && ip_selected(k->server_ip);
}

#endif
