// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Packet-path tracer: tracepoints, tcx observers and netfilter links only. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

#include "tracer/tracer.h"
#include "tracer/maps.h"
#include "tracer/track.h"
#include "tracer/tp.h"
#include "tracer/tcx.h"
#include "tracer/nf.h"
#include "tracer/sock.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that BTF, and so bpf2go, carries the enums Go reads. */
const enum ez_trc_stage ez_trc_stage_enum __attribute__((unused));
const enum ez_trc_table ez_trc_table_enum __attribute__((unused));
const enum ez_trc_prio ez_trc_prio_enum __attribute__((unused));
const enum ez_trc_nf ez_trc_nf_enum __attribute__((unused));
const enum ez_trc_end ez_trc_end_enum __attribute__((unused));
const enum ez_trc_counter ez_trc_counter_enum __attribute__((unused));
const enum ez_trc_limits ez_trc_limits_enum __attribute__((unused));
