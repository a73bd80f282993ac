// Package bpftest holds the eBPF unit-test programs (bpf/test/units.bpf.c):
// tc programs that run the shortcut's and the tracer's inline helpers with
// BPF_PROG_TEST_RUN. Its tests need root.
package bpftest

// clang-19 is pinned: CI regenerates and fails on any diff (make check-generated).
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_flow -type ez_sock_ends -type ez_conn_key -type ez_cidr_key -type test_bound units ../../bpf/test/units.bpf.c -- -I../../bpf/include -I../../bpf
