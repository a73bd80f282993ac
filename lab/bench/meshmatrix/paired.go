package meshmatrix

// Paired mode (--pairs N): instead of rounds of wrk runs under each
// configuration, one agent per node runs with everything on (the bypass
// and the shortcut, `both`, the sidecar's second outbound port excluded
// from the shortcut) and two comparisons are made on the same chain,
// phase by phase, in the quads of bench.QuadOrder (an A/A pair, both
// phases B, and an A/B pair):
//
//   - the bypass: one client connection kept through the whole run, the
//     chain's connections established; A: the bypass paused on both nodes
//     (bypass.Switch, programs attached), B: on. The switch flips between
//     two requests, when the client waits for nothing.
//   - the shortcut on the client leg (app to sidecar): switching a
//     connection between the shortcut and the kernel path in place would
//     break byte order, so each phase opens a fresh connection: A to the
//     sidecar's excluded port (the kernel path), B to its usual port
//     (taken). The other three loopback legs stay on the shortcut.
//
// A phase is the median response time of the GETs of the 612 B page one
// at a time (`workload http-phases` in the client pod, on the client CPU).
// Each comparison reports the median of the per-quad differences with its
// 95% bootstrap interval, the A/A row's, and per program its runs and ns
// per request in each kind of A/B phase (BPF run-time statistics).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/bench/bypass"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// pairedArgs are the agents' flags in paired mode: both features, the
// sidecar's kernel-path port excluded from the shortcut.
var pairedArgs = []string{"--bypass", "--exclude-ports", strconv.Itoa(PortOutboundKernel)}

// Comparisons of a paired run, in report order.
const (
	cmpBypass   = "bypass (cross-node legs)"
	cmpShortcut = "shortcut (client leg)"
)

// pairedRow is one comparison of a paired run.
type pairedRow struct {
	name     string
	a, b     string // what A and B are
	ab, aa   bench.Paired
	medA     float64 // median over the A/B pairs' A phases of the phase medians (us)
	medB     float64
	requests int
	// Programs' statistics in the A/B phases ([0] A, [1] B) and the
	// requests completed in them.
	hooks [2]map[string]bench.ProgStat
	reqs  [2]int
}

// runPairedModes is Run in paired mode.
func runPairedModes(ctx context.Context, o Options, w io.Writer) error {
	if o.Phase < 10*time.Millisecond || o.Pairs < 20 {
		return fmt.Errorf("bench mesh-matrix --pairs %d (>= 20) --phase %s (>= 10ms)", o.Pairs, o.Phase)
	}
	if len(o.Modes) == 0 {
		return errors.New("bench mesh-matrix: no routing mode")
	}
	start := time.Now()
	fmt.Fprintf(w, "eztunnel bench mesh-matrix --pairs %d --phase %s: %d mode(s); the client (one request at a time) on CPU %s, proxies and nginx on CPU %s; load average %s\n",
		o.Pairs, o.Phase, len(o.Modes), cpuName(o.ClientCPU), cpuName(o.ChainCPU), loadavg())
	rows := map[multinode.Mode][]pairedRow{}
	for _, mode := range o.Modes {
		err := withChain(mode, o, w, func(ch *chain, tmp string, wl workload.Client, nodes []*multinode.Node) error {
			r, err := runPaired(ctx, o, mode, ch, tmp, wl, nodes, w)
			rows[mode] = r
			return err
		})
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
	}
	fmt.Fprintf(w, "\ndone in %s; load average %s\n", time.Since(start).Round(time.Second), loadavg())
	reportPaired(w, o, rows)
	return nil
}

// runPaired starts the agents and the chain, then makes both comparisons.
func runPaired(ctx context.Context, o Options, mode multinode.Mode, ch *chain, tmp string, wl workload.Client, nodes []*multinode.Node, w io.Writer) (_ []pairedRow, err error) {
	spec := bypass.AgentSpec{Exe: o.Agent, PinPrefix: pinPrefix, Args: pairedArgs, Endpoints: true}
	ba, err := bypass.RunAgents(ctx, spec, tmp, nodes...)
	if err != nil {
		return nil, err
	}
	a := &agents{ba}
	defer func() {
		ch.stop()
		if serr := a.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	if err := ch.start(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "%s: placement: client CPUs %s; %s\n", mode, cpuName(o.ClientCPU), ch.placement())
	if err := ch.probe(ctx, wl, o.Probes); err != nil {
		return nil, err
	}
	if _, err := runWrk(ctx, o, wl, ch, 10, time.Second); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	setPaused, closeSwitches, err := a.OpenSwitches()
	if err != nil {
		return nil, err
	}
	defer closeSwitches()
	pause := func(dp bench.Side) error { return setPaused(dp == bench.SideA) }
	statsOn, err := bench.EnableProgStats()
	if err != nil {
		return nil, err
	}
	defer statsOn.Close()
	progs, err := bench.OpenProgs("ez_")
	if err != nil {
		return nil, err
	}
	defer progs.Close()
	cl, err := startPhaser(ctx, wl, ch.client)
	if err != nil {
		return nil, err
	}
	defer cl.close()
	keep := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), PortOutbound).String()
	kernel := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), PortOutboundKernel).String()
	// Warm-up of the kept connection, on the bypass.
	if _, err := cl.phase("keep", keep, 500*time.Millisecond); err != nil {
		return nil, err
	}
	var rows []pairedRow
	for _, c := range []struct {
		name, a, b string
		set        func(bench.Side) error
		req        func(bench.Side) (verb, addr string)
		check      func(c0, c1 counters) error
	}{
		{cmpBypass, "paused", "on", pause,
			func(bench.Side) (string, string) { return "keep", keep },
			func(c0, c1 counters) error {
				d := c1.sub(c0)
				if d.bypassed == 0 || d.fallbacks["paused"] == 0 {
					return fmt.Errorf("bypassed %v, paused %v packets: the two paths were not both taken", d.bypassed, d.fallbacks["paused"])
				}
				return nil
			}},
		{cmpShortcut, "excluded (kernel path)", "taken", func(bench.Side) error { return nil },
			func(s bench.Side) (string, string) {
				if s == bench.SideA {
					return "fresh", kernel
				}
				return "fresh", keep
			},
			func(c0, c1 counters) error {
				// B and both A/A phases open a connection the shortcut
				// pairs, A one it excludes.
				if p, x := c1.pairs-c0.pairs, c1.excluded-c0.excluded; p < float64(3*o.Pairs) || x < float64(o.Pairs) {
					return fmt.Errorf("%v connections paired (want at least %d), %v excluded (want at least %d): the two paths were not both taken", p, 3*o.Pairs, x, o.Pairs)
				}
				return nil
			}},
	} {
		c0, err := a.counters()
		if err != nil {
			return nil, err
		}
		row, err := pairedOne(o, cl, progs, c.set, c.req)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		c1, err := a.counters()
		if err != nil {
			return nil, err
		}
		if err := c.check(c0, c1); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		row.name, row.a, row.b = c.name, c.a, c.b
		rows = append(rows, row)
		fmt.Fprintf(w, "%s paired %-24s A/B %s  A/A %s  (A %.1f us, B %.1f us; %d requests)\n", mode, c.name, row.ab, row.aa, row.medA, row.medB, row.requests)
	}
	return rows, ch.probe(ctx, wl, o.Probes)
}

// pairedOne runs the quads of one comparison: set puts a side's datapath
// in place, req says what the client's phase of a side asks for.
func pairedOne(o Options, cl *phaser, progs *bench.Progs, set func(bench.Side) error, req func(bench.Side) (string, string)) (row pairedRow, err error) {
	row.hooks = [2]map[string]bench.ProgStat{{}, {}}
	quads, err := bench.RunQuads(o.Pairs, bench.SideB, set, func(s bench.Side) (workload.HTTPPhase, error) {
		ab := s == bench.SideA || s == bench.SideB
		var st0 map[string]bench.ProgStat
		if ab {
			if st0, err = progs.Read(); err != nil {
				return workload.HTTPPhase{}, err
			}
		}
		verb, addr := req(s)
		ph, err := cl.phase(verb, addr, o.Phase)
		if err != nil || !ab {
			return ph, err
		}
		st1, err := progs.Read()
		if err != nil {
			return ph, err
		}
		k := 0
		if s == bench.SideB {
			k = 1
		}
		for name, v := range st1 {
			row.hooks[k][name] = row.hooks[k][name].Add(v.Sub(st0[name]))
		}
		row.reqs[k] += ph.N
		return ph, nil
	})
	if err != nil {
		return row, err
	}
	med := func(ps []workload.HTTPPhase) []float64 {
		out := make([]float64, len(ps))
		for i, p := range ps {
			out[i] = p.MedianUs
			row.requests += p.N
		}
		return out
	}
	as, bs := med(quads[bench.SideA]), med(quads[bench.SideB])
	aa1, aa2 := med(quads[bench.SideAA1]), med(quads[bench.SideAA2])
	seed := uint64(len(as)) // recomputable from the report's data
	if row.ab, err = bench.ComparePaired(as, bs, seed); err != nil {
		return row, err
	}
	if row.aa, err = bench.ComparePaired(aa1, aa2, seed); err != nil {
		return row, err
	}
	slices.Sort(as)
	slices.Sort(bs)
	row.medA, row.medB = stats.Quantile(as, 0.5), stats.Quantile(bs, 0.5)
	return row, nil
}

// phaser is `workload http-phases` running in the client pod.
type phaser struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	errb  strings.Builder
	close func()
}

// startPhaser starts the client in pod p, placed as wl says.
func startPhaser(ctx context.Context, wl workload.Client, p *multinode.Pod) (*phaser, error) {
	cctx, cancel := context.WithCancel(ctx)
	ph := &phaser{cmd: p.Cmd(cctx, wl.Exe, "workload", "http-phases", "--path", smallPage)}
	in, err := ph.cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	out, err := ph.cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	ph.cmd.Stderr = &ph.errb
	if err := wl.Start(p, ph.cmd); err != nil {
		cancel()
		return nil, fmt.Errorf("workload http-phases in %s: %w", p.Name, err)
	}
	ph.in, ph.out = in, bufio.NewReader(out)
	ph.close = func() {
		in.Close()
		bench.WaitOrKill(ph.cmd, cancel)
	}
	return ph, nil
}

// phase asks the client for one phase.
func (ph *phaser) phase(verb, addr string, d time.Duration) (workload.HTTPPhase, error) {
	return workload.AskPhase(ph.in, ph.out, "http-phases", fmt.Sprintf("%s %s %s", verb, addr, d), &ph.errb)
}

// reportPaired prints the paired rows of every mode and their per-hook
// costs.
func reportPaired(w io.Writer, o Options, rows map[multinode.Mode][]pairedRow) {
	fmt.Fprintf(w, "\nPaired: %d quads of %s phases per comparison (an A/A pair, B in both phases, and an A/B pair; bench.QuadOrder); a phase is the median response time of its requests (612 B page, one at a time, through the whole chain); B vs A: median of the per-quad differences, with its 95%% bootstrap interval; a row judges only if its A/A interval holds 0 and is within ±%.0f%%\n",
		o.Pairs, o.Phase, bench.AAMaxHalfWidth)
	for _, mode := range o.Modes {
		fmt.Fprintf(w, "\n%s:\n", mode)
		var out, hooks [][]string
		for _, r := range rows[mode] {
			out = append(out, []string{r.name, r.a, r.b, strconv.FormatFloat(r.medA, 'f', 1, 64), strconv.FormatFloat(r.medB, 'f', 1, 64),
				r.ab.String(), r.aa.String(), bench.JudgedCell(r.aa)})
			hooks = append(hooks, hookRows(r)...)
		}
		var b strings.Builder
		bench.WriteTable(&b, []string{"comparison", "A", "B", "A (us)", "B (us)", "B vs A", "A/A", "judged"}, out)
		fmt.Fprintf(&b, "\nPer hook (BPF run-time statistics, both nodes' programs, in the A/B pairs' phases; a bypass paused or a connection excluded runs its programs, which pass):\n")
		bench.WriteTable(&b, []string{"comparison", "program", "runs per request, A", "ns per run, A", "runs per request, B", "ns per run, B", "ns per request, B - A"}, hooks)
		io.WriteString(w, b.String())
	}
}

// hookRows are a comparison's per-program rows: programs that ran in
// either kind of phase.
func hookRows(r pairedRow) [][]string {
	var out [][]string
	names := slices.Sorted(maps.Keys(r.hooks[1]))
	for _, name := range names {
		if r.hooks[0][name].Runs == 0 && r.hooks[1][name].Runs == 0 {
			continue
		}
		cells := []string{r.name, name}
		var perReq [2]float64
		for k := range 2 {
			h, n := r.hooks[k][name], float64(max(r.reqs[k], 1))
			perReq[k] = float64(h.Runtime.Nanoseconds()) / n
			cells = append(cells, strconv.FormatFloat(float64(h.Runs)/n, 'f', 2, 64), strconv.FormatFloat(h.NsPerRun(), 'f', 0, 64))
		}
		out = append(out, append(cells, strconv.FormatFloat(perReq[1]-perReq[0], 'f', 0, 64)))
	}
	return out
}
