/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The errno values the datapath tells apart (vmlinux.h carries no macros). */
#pragma once
#define ENOENT 2
#define ENOMEM 12
#define EBUSY 16
#define EEXIST 17
#define ENOSPC 28
#define E2BIG 7
