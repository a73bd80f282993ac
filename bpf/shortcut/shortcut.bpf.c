// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket shortcut: sockops + sk_msg + SOCKHASH, with cgroup_skb egress for NAT and tp_btf for reads. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "shortcut/shortcut.h"
#include "shortcut/maps.h"
#include "shortcut/egress.h"
#include "shortcut/nat.h"
#include "shortcut/unread.h"
#include "shortcut/splice.h"
#include "shortcut/sockops.h"
#include "shortcut/skmsg.h"
#include "shortcut/release.h"
#include "shortcut/iter.h"
#include "shortcut/recv.h"
#include "shortcut/adopt.h"

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
