// Package bypass is the bridge-bypass program family: tcx ingress programs
// on pods' host-side veths and on the uplink or VXLAN device that redirect
// established, conntrack-confirmed, non-NAT TCP and UDP flows between pods
// (of one node, or of two nodes) past the bridge and the node's stack. It
// loads, attaches and reads its eBPF programs and maps.
package bypass

// clang-19 is pinned: CI regenerates and fails on any diff (make check-generated).
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_bp_ep_key -type ez_bp_endpoint -type ez_bp_device -type ez_bp_ctl -type ez_bp_flow -type ez_bp_flow_key bypass ../../../bpf/bypass/bypass.bpf.c -- -I../../../bpf/include -I../../../bpf
