/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The errno values the programs tell apart (vmlinux.h carries no macros). */
#ifndef EZ_LIB_ERRNO_H
#define EZ_LIB_ERRNO_H

#define ENOENT 2
#define E2BIG 7
#define ENOMEM 12
#define EBUSY 16
#define EEXIST 17
#define ENOSPC 28
#define ECONNREFUSED 111

#endif
