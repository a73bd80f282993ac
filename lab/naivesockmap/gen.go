// Package naivesockmap loads the lab's naive sockmap (bpf/naive): the
// peers' model of a socket shortcut, which bench hops measures eztunnel
// against. Lab only: the agent links none of it.
package naivesockmap

//go:generate go tool bpf2go -cc clang-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3" -target bpfel -type ez_naive_tuple -type ez_naive_end naive ../../bpf/naive/naive.bpf.c -- -I../../bpf/include -I../../bpf
