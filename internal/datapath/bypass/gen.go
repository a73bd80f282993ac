// Package bypass is the bridge-bypass program family (first slice, same node
// only): a tcx ingress program on pods' host-side veths that redirects
// established, conntrack-confirmed, non-NAT TCP and UDP flows between pods of
// one node straight into the destination pod. It loads, attaches and reads
// its eBPF program and maps; nothing installs it yet.
package bypass

// clang-19 is pinned: CI regenerates and fails on any diff (make check-generated).
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_bp_ep_key -type ez_bp_endpoint bypass ../../../bpf/bypass/bypass.bpf.c -- -I../../../bpf/include -I../../../bpf
