// Package services is the Service load-balancer program family (ClusterIP
// at the socket): cgroup connect, sendmsg, recvmsg and getpeername programs
// that translate a frontend (ClusterIP:port:protocol) to a backend. It
// loads and attaches the programs and writes the maps; internal/datapath/services/svcsync
// decides what to write.
package services

// clang-19 is pinned: CI regenerates and fails on any diff (make check-generated).
//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_svc_key -type ez_svc -type ez_svc_slot_key -type ez_svc_member_key -type ez_svc_backend -type ez_svc_rev -type ez_svc_sock -type ez_svc_affinity_key -type ez_svc_affinity -type ez_svc_gone_key -type ez_svc_orig_key -type ez_svc_orig -type ez_svc_np_key -type ez_svc_np -type ez_svc_proxy -type ez_svc_proxy_span services ../../../bpf/services/services.bpf.c -- -I../../../bpf/include -I../../../bpf
