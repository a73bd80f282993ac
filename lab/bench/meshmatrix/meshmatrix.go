// Package meshmatrix is `eztunnel-lab bench mesh-matrix`: Yang et al.'s
// configuration matrix (the "network shortcut" paper, figures 8-9) for a
// sidecar mesh across the two nodes of the multi-node lab (lab/multinode),
// in each routing mode. An HTTP chain of sidecar pods (see chain) is driven
// by wrk at several concurrencies under four configurations run in
// interleaved rounds: no agent, the socket shortcut only (the paper's
// intra-pod optimisation), the tc bypass only (inter-pod) and both (full).
// Every wrk run must finish without socket errors or non-2xx responses,
// every configuration must show in the agents' counters that it
// accelerated what it is for, and an integrity probe checks bodies byte
// for byte through the chain; otherwise the run fails.
package meshmatrix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/lab/bench/bypass"
	"github.com/eztunnel/eztunnel/lab/bench/mesh"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Configurations, in the order of the report.
const (
	Baseline     = "baseline"
	ShortcutOnly = "shortcut only"
	BypassOnly   = "bypass only"
	Both         = "both"
)

// Idle is an agent that accelerates nothing (no bypass, every connection
// excluded from the shortcut): what its programs cost the kernel path.
// Not in the default set.
const Idle = "agent idle"

// IdlePsock is Idle with the tracepoint that counts reads refused, so
// reads are counted where only sockets with a psock pay: fexit on
// tcp_bpf_recvmsg where this host allows it, else the gauge
// (docs/kernels.md). On a host that refuses fexit it shows what Idle
// would cost there. Not in the default set.
const IdlePsock = "agent idle, no read tracepoint"

var configs = []string{Baseline, ShortcutOnly, BypassOnly, Both}

// idleRefusePrefix begins the name of an idle configuration with programs
// refused as a kernel would refuse them (EZTUNNEL_TEST_REFUSE_PROGRAMS):
// `idle-refuse:ez_sc_recv+ez_sc_close_reset` on the command line. Refusing
// a hook's programs turns off that part only (docs/kernels.md), so such
// configurations side by side show what each hook costs the chain. Not in
// the default set.
const (
	idleRefuseName   = "idle-refuse:"
	idleRefusePrefix = "agent idle, refused "
)

// IdleRefusing is the idle configuration with progs refused.
func IdleRefusing(progs ...string) string { return idleRefusePrefix + strings.Join(progs, "+") }

// refusedPrograms are the programs configuration cfg refuses (nil: none):
// IdlePsock's read tracepoint where this host would run it (none where
// fexit on tcp_bpf_recvmsg loads: the agent counts reads there already
// only for psock sockets), an IdleRefusing configuration's list.
func refusedPrograms(cfg string) []string {
	if cfg == IdlePsock {
		return bypass.PsockRefusals()
	}
	list, ok := strings.CutPrefix(cfg, idleRefusePrefix)
	if !ok {
		return nil
	}
	return strings.Split(list, "+")
}

// programName: what a refused program may be called (a C identifier).
var programName = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

// ConfigNames are the names of the configurations on the command line.
var ConfigNames = map[string]string{
	"baseline": Baseline, "shortcut": ShortcutOnly, "bypass": BypassOnly, "both": Both, "idle": Idle,
	"idle-psock": IdlePsock,
}

// ParseConfigs reads command-line names (ConfigNames) into configurations
// in the report's order; the baseline is always among them.
func ParseConfigs(names []string) ([]string, error) {
	want := map[string]bool{Baseline: true}
	var refusing []string // idle-refuse: configurations, in the order given
	for _, n := range names {
		if list, ok := strings.CutPrefix(n, idleRefuseName); ok {
			progs := strings.Split(list, "+")
			for _, p := range progs {
				if !programName.MatchString(p) {
					return nil, fmt.Errorf("configuration %q: %q is not a program name (idle-refuse:PROG+PROG...)", n, p)
				}
			}
			if c := IdleRefusing(progs...); !slices.Contains(refusing, c) {
				refusing = append(refusing, c)
			}
			continue
		}
		c, ok := ConfigNames[n]
		if !ok {
			return nil, fmt.Errorf("configuration %q: not one of baseline, shortcut, bypass, both, idle, idle-psock, idle-refuse:PROG+PROG...", n)
		}
		want[c] = true
	}
	var out []string
	for _, c := range []string{Baseline, Idle, IdlePsock} {
		if want[c] {
			out = append(out, c)
		}
	}
	out = append(out, refusing...)
	for _, c := range []string{ShortcutOnly, BypassOnly, Both} {
		if want[c] {
			out = append(out, c)
		}
	}
	return out, nil
}

// Options configure a run.
type Options struct {
	Agent    string           // the eztunnel binary
	Modes    []multinode.Mode // routing modes, a lab each
	Rounds   int              // interleaved rounds of the four configurations
	Duration time.Duration    // each wrk run
	Concs    []int            // wrk connections (concurrency)
	Threads  int              // wrk threads (at most the concurrency)
	// CPU of wrk, and of every proxy and server of the chain; -1: any.
	ClientCPU, ChainCPU int
	Probes              int // integrity probes per page before and after each configuration's runs
	// Configs to run, in the report's order (ParseConfigs); nil: the four
	// of the paper.
	Configs []string
	// Pairs > 0: paired mode instead of rounds (see paired.go), this many
	// quads of Phase each per comparison; Lab is the eztunnel-lab binary
	// (its client runs in the client pod).
	Pairs int
	Phase time.Duration
	Lab   string
}

// Run measures every mode and writes progress and the report to w.
func Run(ctx context.Context, o Options, w io.Writer) error {
	if o.Pairs > 0 {
		return runPairedModes(ctx, o, w)
	}
	if o.Rounds < 1 || o.Duration < time.Second || len(o.Concs) == 0 || o.Threads < 1 {
		return fmt.Errorf("bench mesh-matrix: rounds %d (>= 1), duration %s (>= 1s), concurrencies %v, threads %d", o.Rounds, o.Duration, o.Concs, o.Threads)
	}
	for _, c := range o.Concs {
		if c < 1 {
			return fmt.Errorf("bench mesh-matrix: concurrency %d", c)
		}
	}
	if len(o.Modes) == 0 {
		return errors.New("bench mesh-matrix: no routing mode")
	}
	if len(o.Configs) == 0 {
		o.Configs = configs
	}
	start := time.Now()
	fmt.Fprintf(w, "eztunnel bench mesh-matrix: %d mode(s) x %d round(s) x %d configurations (order rotated each round) x concurrency %v, wrk %s each, -t%d (fewer when c is smaller); wrk on CPU %s, proxies and nginx on CPU %s, agents on any; load average %s\n",
		len(o.Modes), o.Rounds, len(o.Configs), o.Concs, o.Duration, o.Threads, cpuName(o.ClientCPU), cpuName(o.ChainCPU), loadavg())
	all := map[multinode.Mode]results{}
	for _, mode := range o.Modes {
		r, err := runMode(ctx, o, mode, w)
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		all[mode] = r
	}
	fmt.Fprintf(w, "\ndone in %s; load average %s\n", time.Since(start).Round(time.Second), loadavg())
	fmt.Fprintf(w, "\nmedians over %d round(s); in parentheses the median of the per-round changes against the baseline of the same round, then the smallest and largest of them (latency: negative is faster; RPS: positive is more)\n", o.Rounds)
	for _, mode := range o.Modes {
		fmt.Fprintf(w, "\n%s\n\n", mode)
		table(w, all[mode], o.Configs, o.Concs)
	}
	return nil
}

func cpuName(c int) string {
	if c < 0 {
		return "any"
	}
	return strconv.Itoa(c)
}

func placement(cpu int) workload.Placement {
	if cpu < 0 {
		return workload.Placement{}
	}
	return workload.Placement{CPUs: []int{cpu}}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// runMode builds a two-node lab in mode and runs the rounds.
func runMode(ctx context.Context, o Options, mode multinode.Mode, w io.Writer) (results, error) {
	out := results{}
	err := withChain(mode, o, w, func(ch *chain, tmp string, wl workload.Client, nodes []*multinode.Node) error {
		for r := range o.Rounds {
			for _, cfg := range rotate(o.Configs, r) {
				if err := runConfig(ctx, o, w, mode, r, cfg, tmp, ch, wl, out, nodes...); err != nil {
					return fmt.Errorf("round %d, %s: %w", r+1, cfg, err)
				}
			}
		}
		return nil
	})
	return out, err
}

// withChain builds a two-node lab in mode with the chain's pods and
// configuration (not started) and runs fn in it; wl places processes on
// the client CPU.
func withChain(mode multinode.Mode, o Options, w io.Writer, fn func(ch *chain, tmp string, wl workload.Client, nodes []*multinode.Node) error) (err error) {
	l, err := bypass.NewLab("bmm", mode, pinPrefix)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	n1, n2 := l.Node(1), l.Node(2)
	client, err := n1.AddPod("client", true)
	if err != nil {
		return err
	}
	front, err := n2.AddPod("front", true)
	if err != nil {
		return err
	}
	back, err := n1.AddPod("back", true)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "eztunnel-bench-meshmatrix-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	os.Chmod(tmp, 0o755)
	ch, err := newChain(client, front, back, tmp, placement(o.ChainCPU))
	if err != nil {
		return err
	}
	defer ch.stop()
	fmt.Fprintf(w, "%s: client %s (%s) -> front %s (%s) -> back %s (%s)\n", mode,
		client.IPv4, n1.Name, front.IPv4, n2.Name, back.IPv4, n1.Name)
	return fn(ch, tmp, workload.Client{Exe: o.Lab, Placement: placement(o.ClientCPU)}, []*multinode.Node{n1, n2})
}

// runConfig starts the agents of cfg and then the chain (every connection
// of the chain is opened after the agents), runs wrk at each concurrency,
// and stops both.
func runConfig(ctx context.Context, o Options, w io.Writer, mode multinode.Mode, r int, cfg, tmp string,
	ch *chain, wl workload.Client, out results, nodes ...*multinode.Node) (err error) {
	a, err := startAgents(ctx, o.Agent, cfg, tmp, nodes...)
	if err != nil {
		return err
	}
	defer func() {
		ch.stop()
		if serr := a.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	if err := ch.start(ctx); err != nil {
		return err
	}
	if r == 0 && cfg == o.Configs[0] {
		fmt.Fprintf(w, "%s: placement: wrk CPUs %s; %s\n", mode, cpuName(o.ClientCPU), ch.placement())
	}
	if err := ch.probe(ctx, wl, o.Probes); err != nil {
		return err
	}
	// Warm-up, not recorded: the proxies' pools, caches.
	if _, err := runWrk(ctx, o, wl, ch, 10, time.Second); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	pfs, err := procfs.NewDefaultFS()
	if err != nil {
		return err
	}
	for _, c := range o.Concs {
		c0, err := a.counters()
		if err != nil {
			return err
		}
		t0, err := readCPUs(pfs)
		if err != nil {
			return err
		}
		res, err := runWrk(ctx, o, wl, ch, c, o.Duration)
		if err != nil {
			return fmt.Errorf("c=%d: %w", c, err)
		}
		t1, err := readCPUs(pfs)
		if err != nil {
			return err
		}
		c1, err := a.counters()
		if err != nil {
			return err
		}
		s := sample{round: r, wrk: res, acc: c1.sub(c0), cpu: t1.since(t0)}
		if err := check(cfg, s); err != nil {
			return fmt.Errorf("c=%d: %w", c, err)
		}
		out.add(cfg, c, s)
		fmt.Fprintf(w, "%s round %d/%d %-13s c=%-3d %s\n", mode, r+1, o.Rounds, cfg, c, s.line())
	}
	return ch.probe(ctx, wl, o.Probes)
}

// runWrk runs wrk in the client pod against its sidecar.
func runWrk(ctx context.Context, o Options, wl workload.Client, ch *chain, conns int, d time.Duration) (mesh.WrkResult, error) {
	url := fmt.Sprintf("http://127.0.0.1:%d/%s", PortOutbound, smallPage)
	outb, _, err := wl.Run(ctx, ch.client, d+time.Minute, "wrk", "-t", strconv.Itoa(min(o.Threads, conns)),
		"-c", strconv.Itoa(conns), "-d", fmt.Sprintf("%ds", int(d.Seconds())), "--timeout", "5s", "--latency", url)
	if err != nil {
		return mesh.WrkResult{}, err
	}
	res, err := mesh.ParseWrk(string(outb))
	if err != nil {
		return res, err
	}
	if res.Errors > 0 || res.Requests <= 0 {
		return res, fmt.Errorf("wrk: %.0f requests, %.0f socket errors, %.0f non-2xx/3xx responses:\n%s", res.Requests, res.SocketErrors, res.Non2xx, outb)
	}
	return res, nil
}
