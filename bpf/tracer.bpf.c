// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Packet-path tracer: tracepoints, tcx observers and netfilter links only. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#include "tracer.h"
#include "lib/trace_maps.bpf.h"
#include "lib/trace_parse.bpf.h"
#include "lib/trace_track.bpf.h"
#include "lib/trace_tp.bpf.h"
#include "lib/trace_tcx.bpf.h"
#include "lib/trace_nf.bpf.h"
#include "lib/trace_sock.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Referenced so that BTF, and so bpf2go, carries the enums Go reads. */
const enum ez_trc_stage ez_trc_stage_enum __attribute__((unused));
const enum ez_trc_table ez_trc_table_enum __attribute__((unused));
const enum ez_trc_end ez_trc_end_enum __attribute__((unused));
const enum ez_trc_counter ez_trc_counter_enum __attribute__((unused));
