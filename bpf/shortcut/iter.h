/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * iter/tcp, opened by `eztunnel connections` in each network namespace (the
 * iterator sees the namespace it was opened in): one struct ez_conn_record
 * per paired socket (or one that left after a switch) not closed yet.
 * Read-only; runs only when a reader reads the iterator, never on the data
 * path. Not iter/bpf_sk_storage_map, which walks every namespace at once:
 * some kernels refuse map-element iterators to processes other than the
 * global PID 1 (EPERM, "processed 0 insns"), while iter/tcp loads everywhere
 * from 5.9 (docs/kernels.md).
 */
#ifndef EZ_SHORTCUT_ITER_H
#define EZ_SHORTCUT_ITER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include "shortcut/control.h"
#include "shortcut/unread.h"

#define EZ_TCP_CLOSE 7

#endif
