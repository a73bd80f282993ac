package scale

import (
	"fmt"
	"slices"
	"strings"
)

// Descriptors each process keeps beside its connections: stdio, the
// runtime's epoll and pipes, the listening socket, files.
const reserveFDs = 64

// maxPerPort is how many connections one client address may hold to one
// server address and port: the ephemeral ports 1024-65535 the client pod
// is given, less a margin for the probe and for ports in TIME_WAIT.
const maxPerPort = 65535 - 1024 + 1 - 4096

// maxProcs bounds the processes of a side: each costs a Go runtime's
// memory (about 10 MB) besides its connections.
const maxProcs = 1000

// Plan splits one step's connections over server and holder processes:
// holder i opens Shares[i] connections to server i, which listens on
// Ports[i] and accepts them all. Each process holds at most PerProc
// connections, so a process of either side stays within its descriptor
// limit, and each server port gets fewer connections than the client has
// ephemeral ports.
type Plan struct {
	Conns   int   `json:"conns"`
	PerProc int   `json:"per_process"`
	Shares  []int `json:"-"`
	Ports   []int `json:"-"`
}

// Procs is the number of server (and of holder) processes.
func (p Plan) Procs() int { return len(p.Shares) }

// PerHolder is each holder's part of total connections at once.
func (p Plan) PerHolder(total int) int { return max(1, (total+p.Procs()-1)/p.Procs()) }

// PlanStep plans n connections for processes whose RLIMIT_NOFILE is
// nofile, servers listening from port firstPort on. The shares are as even
// as can be, the larger first.
func PlanStep(n int, nofile uint64, firstPort int) (Plan, error) {
	if n < 1 {
		return Plan{}, fmt.Errorf("a step of %d connections", n)
	}
	if nofile <= reserveFDs {
		return Plan{}, fmt.Errorf("RLIMIT_NOFILE %d leaves no descriptor for a connection (%d are kept for the process)", nofile, reserveFDs)
	}
	per := int(min(nofile-reserveFDs, maxPerPort))
	procs := (n + per - 1) / per
	if procs > maxProcs {
		return Plan{}, fmt.Errorf("%d connections need %d processes a side at %d connections each (RLIMIT_NOFILE %d), over %d", n, procs, per, nofile, maxProcs)
	}
	if firstPort < 1024 || firstPort+procs-1 > 65535 {
		return Plan{}, fmt.Errorf("%d server ports from %d do not fit below 65536", procs, firstPort)
	}
	p := Plan{Conns: n, PerProc: per}
	for i := range procs {
		share := n / procs
		if i < n%procs {
			share++
		}
		p.Shares = append(p.Shares, share)
		p.Ports = append(p.Ports, firstPort+i)
	}
	return p, nil
}

// ParseSteps reads --steps: connection counts, ascending, with k and M
// suffixes allowed ("1k,10k,100k,1M").
func ParseSteps(s []string) ([]int, error) {
	var out []int
	for _, f := range s {
		f = strings.TrimSpace(f)
		mult := 1
		switch {
		case strings.HasSuffix(f, "k"):
			mult, f = 1000, strings.TrimSuffix(f, "k")
		case strings.HasSuffix(f, "M"):
			mult, f = 1000000, strings.TrimSuffix(f, "M")
		}
		var n int
		if _, err := fmt.Sscanf(f, "%d", &n); err != nil || n < 1 || fmt.Sprint(n) != f {
			return nil, fmt.Errorf("step %q: give a positive count (k and M suffixes allowed)", f)
		}
		out = append(out, n*mult)
	}
	if len(out) == 0 || !slices.IsSorted(out) {
		return nil, fmt.Errorf("steps %v: give at least one, ascending", s)
	}
	return out, nil
}
