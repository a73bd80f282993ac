// Package shortcut is the socket-shortcut program family: it loads, attaches
// and reads its eBPF programs and maps. internal/datapath installs it.
package shortcut

// The shortcut's bpf2go directive (the tracer has its own in internal/tracer). clang-19 is pinned: CI regenerates
// and fails on any diff (make check-generated).
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_conn_key -type ez_pair -type ez_sock -type ez_unread -type ez_cidr_key -type ez_cgroup -type ez_adopt -type ez_adopt_ref -type ez_reset_key -type ez_conn_index shortcut ../../../bpf/shortcut/shortcut.bpf.c -- -I../../../bpf/include -I../../../bpf
