package tracer

// The tracer's bpf2go directive; each datapath family has its own in
// internal/datapath/<family>/gen.go.
// clang-19 is pinned: CI regenerates and fails on any diff (make check-generated).
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_trc_pkt tracer ../../bpf/tracer/tracer.bpf.c -- -I../../bpf/include -I../../bpf
