// Package datapath loads, attaches and reads the socket-shortcut eBPF programs.
package datapath

// The datapath's bpf2go directive (the tracer has its own in internal/tracer). clang-19 is pinned: CI regenerates
// and fails on any diff (make check-generated).
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_conn_key -type ez_pair -type ez_sock -type ez_cidr_key shortcut ../../bpf/shortcut/shortcut.bpf.c -- -I../../bpf/include -I../../bpf
