package bypass

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// Paired mode for the idle agent (--pairs N --pair idle): no agent (A)
// against an agent that accelerates nothing (B: IdleArgs, the bypass off
// and every connection excluded from the shortcut, so its programs run on
// the measured paths and pass), on the same established flows, by
// detaching every link of both nodes' agents and attaching them again in
// place between two round trips (idlelinks.go: the bench holds the links
// of agents that installed and stopped). The quads are bypass paired
// mode's, in blocks on fresh flows (pairedBlock, as runPaired runs them),
// the switch the links: paused is A, detached. The A/A
// pair has the agent attached on both sides: the side whose programs run
// (the noisier, and the one a switch leaves with fresh links) is the one
// whose phase-to-phase noise bounds what the row can resolve. A switch
// (tcx detach and attach wait for RCU under RTNL) is done before its phase
// starts and is not timed in it. The kernel's BPF run-time statistics are
// off in the quads (A has no programs to pay their clock reads) and on in
// a few more per row for the per-hook costs, where no program of the links
// may run in an A phase and some must run in the B phases, or the run
// fails. The agent's process is not in B: a link goes only with its last
// holder, and a running agent holds its own.

// Pair names the two sides of a paired run (--pair).
const (
	PairBypass = "bypass" // the bypass against its kernel path (paired.go)
	PairIdle   = "idle"   // the idle agent against no agent (this file)
	// PairIdleNarrow is PairIdle with the node-wide hooks refused
	// (IdleNarrow): what the idle agent costs on a host that allows
	// fentry and fexit.
	PairIdleNarrow = "idle-narrow"
	// PairIdleUnselected is PairIdleNarrow for pods the agent does not
	// select (IdleUnselected): what the idle agent costs the other pods of
	// a node where it accelerates some.
	PairIdleUnselected = "idle-unselected"
)

// Issue 37's target: the idle agent costs the paths it does not
// accelerate at most this much (percent, the interval's upper end).
const idleTarget = 2.0

// idleRow is a paired row of the idle agent and what its programs cost.
type idleRow struct {
	pairedRow
	pktsPerRT float64 // the client pod's packets (sent and received) per round trip, or per segment sent
}

// runIdlePairedModes is Run with --pair idle: per mode a lab, both nodes'
// idle agents installed and stopped, every path and protocol paired.
func runIdlePairedModes(ctx context.Context, o Options, w io.Writer) error {
	dp := Idle
	switch o.Pair {
	case PairIdleNarrow:
		dp = IdleNarrow
	case PairIdleUnselected:
		dp = IdleUnselected
	}
	fmt.Fprintf(w, "eztunnel bench bypass --pairs %d --pair %s --phase %s: %d mode(s); client on CPU %s (the measuring thread), servers on CPU %s; IPv6 %v; B: %s\n",
		o.Pairs, o.Pair, o.Phase, len(o.Modes), cpuName(o.ClientCPU), cpuName(o.ServerCPU), o.IPv6, dp)
	var only *regexp.Regexp // --switch-links: the links switched; nil: all
	if o.SwitchLinks != "" {
		var err error
		if only, err = regexp.Compile(o.SwitchLinks); err != nil {
			return fmt.Errorf("bench bypass --switch-links: %w", err)
		}
		fmt.Fprintf(w, "--switch-links %s: A detaches only the links that match; the others stay attached on both sides\n", o.SwitchLinks)
	}
	for _, p := range o.Paths {
		if !slices.Contains(paths, p) {
			return fmt.Errorf("bench bypass --paths %s: not one of %s", p, strings.Join(paths, ", "))
		}
	}
	raw, closeRaw, err := openRaw(o)
	if err != nil {
		return err
	}
	defer closeRaw()
	rows := map[multinode.Mode][]idleRow{}
	for _, mode := range o.Modes {
		err := withLab(ctx, o, mode, w, func(b *benchLab) error {
			if o.TCHooksOn {
				if err := tcHooksOn(b, w); err != nil {
					return err
				}
			}
			if dp == IdleUnselected {
				stop, err := addBystanders(ctx, o, b, w)
				defer stop()
				if err != nil {
					return err
				}
			}
			a, err := startAgents(ctx, o, dp, b.tmp, b.n1, b.n2)
			if err != nil {
				return err
			}
			if err := a.stopProcs(); err != nil {
				return errors.Join(err, a.uninstall())
			}
			r, err := runIdlePaired(ctx, o, b, a, only, w, rawMode(raw, o.Pair, o.rawSetup(), mode))
			rows[mode] = r
			return errors.Join(err, a.uninstall())
		})
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
	}
	reportIdlePaired(w, o, rows)
	return nil
}

// tcHooksOn adds a clsact qdisc without filters to each node's loopback
// (--tc-hooks-on), which no measured path crosses. The first tc qdisc or
// tcx link of the host turns on the kernel's ingress and egress hook
// checks for every packet on every device (net_inc_ingress_queue,
// net_inc_egress_queue: static keys), so with it the idle agent's tcx
// links do not turn them on: what they add on a node where something else
// already has. The qdisc goes with the lab's namespaces.
func tcHooksOn(b *benchLab, w io.Writer) error {
	for _, n := range []*multinode.Node{b.n1, b.n2} {
		err := n.Do(func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			return bpfsys.EnsureClsact(lo)
		})
		if err != nil {
			return fmt.Errorf("--tc-hooks-on: a clsact qdisc on %s's loopback: %w", n.Name, err)
		}
		fmt.Fprintf(w, "%s: a clsact qdisc on lo (--tc-hooks-on): the kernel's tc hook checks are on in A and B\n", n.Name)
	}
	return nil
}

// switcher flips both nodes' links at once and times the flips that
// changed something.
type switcher struct {
	held     []*nodeLinks
	attached bool
	took     []float64 // ms per switch
}

func (s *switcher) flip(paused bool) error {
	if s.attached == !paused {
		return nil
	}
	t0 := time.Now()
	errs := make(chan error, len(s.held))
	for _, nl := range s.held {
		go func() { errs <- nl.setAttached(!paused) }()
	}
	var err error
	for range s.held {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		return err
	}
	s.attached = !paused
	s.took = append(s.took, float64(time.Since(t0).Microseconds())/1e3)
	return nil
}

// runIdlePaired takes over the stopped agents' links (only those matching
// only, when set) and measures the paired rows of one mode; the links are
// as the agents left them at the end, also on failure.
func runIdlePaired(ctx context.Context, o Options, b *benchLab, a *agents, only *regexp.Regexp, w io.Writer, raw func(*pairedRun) error) (rows []idleRow, err error) {
	sw := &switcher{attached: true}
	defer func() {
		var rerr error
		for _, nl := range sw.held {
			rerr = errors.Join(rerr, nl.restore())
		}
		if rerr == nil && len(sw.held) > 0 {
			fmt.Fprintf(w, "the agents' links are as they were: every pin with its program, type and target, the order on each tcx hook\n")
		}
		err = errors.Join(err, rerr)
	}()
	var ids []ebpf.ProgramID
	namespaces := []string{b.n1.NetNS, b.n2.NetNS}
	for _, n := range []*multinode.Node{b.n1, b.n2} {
		for _, p := range n.Pods() {
			namespaces = append(namespaces, p.NetNS)
		}
	}
	for i, n := range a.nodes {
		nl, err := takeOver(n, a.pins[i], namespaces, only)
		if err != nil {
			return nil, fmt.Errorf("the links of the agent on %s: %w", n.Name, err)
		}
		sw.held = append(sw.held, nl)
		ids = append(ids, nl.programs()...)
		fmt.Fprintf(w, "%s: the bench holds the stopped agent's %d links (%s)\n", n.Name, len(nl.links), linkKinds(nl))
		if only != nil {
			for _, h := range nl.links {
				fmt.Fprintf(w, "  switched (--switch-links %s): %s\n", only, h.name)
			}
		}
	}
	var switched, kept map[string]bool // nil: every link switched
	if only != nil {
		switched, kept = map[string]bool{}, map[string]bool{}
		for _, nl := range sw.held {
			s, k, err := nl.switchedPrograms()
			if err != nil {
				return nil, err
			}
			maps.Copy(switched, s)
			maps.Copy(kept, k)
		}
	}
	progs, err := bench.OpenProgIDs(ids)
	if err != nil {
		return nil, err
	}
	defer progs.Close()
	runs, err := idleBlocks(ctx, o, b, sw, progs)
	if err != nil {
		return nil, err
	}
	for _, r := range runs {
		row, err := idleOne(o, b, r, sw, progs, switched, kept)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", r.row.path, r.kind, err)
		}
		if err := raw(r); err != nil {
			return nil, fmt.Errorf("bench bypass --raw: %w", err)
		}
		rows = append(rows, row)
		fmt.Fprintf(w, "paired %-10s %-19s A/B %s  A/A %s  (no agent %.1f, agent idle %.1f; %d round trips or streams, %d lost; blocks' A/B medians %s)\n",
			row.path, row.metric, row.ab, row.aa, row.kernelUs, row.bypassUs, row.roundTrips, row.lost, spread(row.blockAB))
	}
	slices.Sort(sw.took)
	fmt.Fprintf(w, "%d switches (both nodes' links detached or attached again, before the phase): median %.1f ms, max %.1f ms\n",
		len(sw.took), stats.Quantile(sw.took, 0.5), sw.took[len(sw.took)-1])
	return rows, nil
}

// idlePaths are the paths --pair idle measures (Options.Paths, else all).
func (o Options) idlePaths() []string {
	if len(o.Paths) == 0 {
		return paths
	}
	return o.Paths
}

// hookQuads are the quads of a row's per-hook pass.
const hookQuads = 4

// idleBlocks runs the quads of every path and protocol (the round trips:
// issue 37's target) with the kernel's BPF run-time statistics off (they
// would cost only the B phases: A has no programs), in blocks as
// runPaired does: the rows' blocks interleaved over the run, each block on
// fresh flows (interleaveBlocks).
func idleBlocks(ctx context.Context, o Options, b *benchLab, sw *switcher, progs *bench.Progs) ([]*pairedRun, error) {
	blocks, err := pairedBlocks(o)
	if err != nil {
		return nil, err
	}
	var runs []*pairedRun
	for _, path := range o.idlePaths() {
		for _, kind := range []pairedKind{tcpRTT, udpRTT} {
			r := newPairedRun(kind, b.servers[path])
			r.row.path = path
			runs = append(runs, r)
		}
	}
	st0, err := progs.Read()
	if err != nil {
		return nil, err
	}
	if err := interleaveBlocks(ctx, o, b.client, runs, blocks, sw.flip, progs, nil); err != nil {
		return nil, err
	}
	st1, err := progs.Read()
	if err != nil {
		return nil, err
	}
	for name, v := range st1 {
		if v.Runs != st0[name].Runs {
			return nil, fmt.Errorf("BPF run-time statistics were on during the A/B quads (%s counted runs): another process holds them on, and their clock reads would cost only the B phases", name)
		}
	}
	for _, r := range runs {
		if err := r.compare(); err != nil {
			return nil, fmt.Errorf("%s, %s: %w", r.row.path, r.kind, err)
		}
	}
	return runs, nil
}

// idleOne completes the row of pr, its quads run: hookQuads quads with the
// kernel's BPF run-time statistics on for the per-hook costs (which must
// show the links detached in A and attached in B), and the client's
// packets per round trip.
func idleOne(o Options, b *benchLab, pr *pairedRun, sw *switcher, progs *bench.Progs, switched, kept map[string]bool) (idleRow, error) {
	r, path, kind := pr.row, pr.row.path, pr.kind
	statsOn, err := bench.EnableProgStats()
	if err != nil {
		return idleRow{}, err
	}
	ho := o
	ho.Pairs = hookQuads
	h, err := pairedOne(ho, b.client, b.servers[path], kind, sw.flip, progs)
	statsOn.Close()
	if err != nil {
		return idleRow{}, fmt.Errorf("per-hook pass: %w", err)
	}
	if err := checkIdleRuns(h, switched, kept); err != nil {
		return idleRow{}, err
	}
	r.hooks, r.rts = h.hooks, h.rts
	// The path's tasks over both passes' A/B phases.
	for k := range 2 {
		for name, v := range h.tasks[k] {
			r.tasks[k][name] = r.tasks[k][name].Add(v)
		}
		r.taskRTs[k] += h.taskRTs[k]
	}
	row := idleRow{pairedRow: r}
	row.pktsPerRT, err = packetsPerRoundTrip(o, b, path, kind)
	return row, err
}

// checkIdleRuns fails unless no program of the links switched ran in the
// A phases, and, with every link switched, some program ran in the B
// phases (the path's packets meet the links). switched and kept name the
// programs of the links switched and of those attached on both sides
// (--switch-links; nil: every link switched); a program with links of both
// kinds may run in A. With --switch-links the programs switched may not run
// on the path at all: the row then measures their links' attachment alone,
// and setAttached proves each detach by the link's ID.
func checkIdleRuns(r pairedRow, switched, kept map[string]bool) error {
	var ran []string
	for name, h := range r.hooks[0] {
		if h.Runs > 0 && (switched == nil || switched[name] && !kept[name]) {
			ran = append(ran, fmt.Sprintf("%s %d times", name, h.Runs))
		}
	}
	var attached uint64
	for _, h := range r.hooks[1] {
		attached += h.Runs
	}
	switch {
	case len(ran) > 0:
		slices.Sort(ran)
		return fmt.Errorf("programs of the links switched ran with them detached: %s", strings.Join(ran, ", "))
	case switched == nil && attached == 0:
		return errors.New("no program ran with the links attached")
	}
	return nil
}

// linkKinds is "tcx 4, cgroup 3, ..." of a node's links.
func linkKinds(nl *nodeLinks) string {
	n := map[string]int{}
	for _, h := range nl.links {
		rel := strings.TrimPrefix(h.pin, nl.dir+"/")
		parts := strings.Split(rel, "/")
		n[parts[min(len(parts)-1, 1)]]++
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		out = append(out, k+" "+strconv.Itoa(n[k]))
	}
	return strings.Join(out, ", ")
}

// packetsPerRoundTrip counts the client pod's packets (every device, both
// directions) over a short phase of kind: per round trip, or per segment
// sent for a stream.
func packetsPerRoundTrip(o Options, b *benchLab, path string, kind pairedKind) (float64, error) {
	var per float64
	err := b.client.Do(func() error {
		measure, closePh, err := dialPhaser(b.servers[path].Addr(o.IPv6), kind)
		if err != nil {
			return err
		}
		defer closePh()
		if _, err := measure(50*time.Millisecond, &pairedRow{}); err != nil { // connected, warm
			return err
		}
		p0, err := netDevPackets()
		if err != nil {
			return err
		}
		s, err := measure(200*time.Millisecond, &pairedRow{})
		if err != nil {
			return err
		}
		p1, err := netDevPackets()
		if err != nil {
			return err
		}
		per = float64(p1-p0) / float64(max(s.n, 1))
		return nil
	})
	return per, err
}

// netDevPackets sums the packets received and sent by every device of the
// calling thread's network namespace but lo.
func netDevPackets() (uint64, error) {
	f, err := os.Open("/proc/thread-self/net/dev")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var sum uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		dev, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(dev) == "lo" {
			continue
		}
		fs := strings.Fields(rest)
		if len(fs) < 10 {
			continue
		}
		for _, i := range []int{1, 9} { // rx packets, tx packets
			v, err := strconv.ParseUint(fs[i], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/net/dev %s: %w", dev, err)
			}
			sum += v
		}
	}
	return sum, sc.Err()
}

// reportIdlePaired prints the idle agent's paired rows of every mode and
// where its programs spend their time.
func reportIdlePaired(w io.Writer, o Options, rows map[multinode.Mode][]idleRow) {
	blocks, _ := pairedBlocks(o)
	if o.Pair == PairIdleUnselected {
		fmt.Fprintf(w, "\nB is the idle agent of a node where it selects another pod than the measured ones (%s), with the close reset on covered devices only; node-wide hooks refused as with idle-narrow", IdleUnselected)
	}
	if o.Pair == PairIdleNarrow || o.Pair == PairIdleUnselected {
		refused := "nothing refused (this host allows fentry and fexit)"
		if r := nodeWideHooks(); len(r) > 0 {
			refused = strings.Join(r, ", ") + " refused"
		}
		fmt.Fprintf(w, "\nB is the idle agent with %s: no hook of it runs for the whole node, as where the host allows fentry and fexit (reads counted at tcp_bpf_recvmsg for sockets with a psock, splices seen at tcp_splice_read)", refused)
	}
	fmt.Fprintf(w, "\nPaired: the idle agent (B: its links attached, nothing selected) vs no agent (A: every link of both nodes' agents detached) on the same flows; %d quads of %s phases (an A/A pair, the agent attached on both sides, and an A/B pair) in %d blocks, the rows' blocks interleaved over the run, each block on fresh flows; median of the per-pair differences of the phases' median round trip, with its 95%% bootstrap interval (resampling whole blocks: it holds the spread between blocks; expanded percentile tails for their number); a row judges only if its A/A interval holds 0 and is within ±%.0f%%; target: the idle agent at most %+.0f%% on the round trips (the interval's upper end)\n",
		o.Pairs, o.Phase, blocks, bench.AAMaxHalfWidth, idleTarget)
	for _, mode := range o.Modes {
		fmt.Fprintf(w, "\n%s (IPv6 %v):\n", mode, o.IPv6)
		var out, hooks [][]string
		for _, r := range rows[mode] {
			verdict := "-"
			if r.metric != tcpStream.String() {
				v, why := bench.Judge(r.ab, r.aa, idleTarget, false)
				verdict = v
				if why != "" {
					verdict += " (" + bench.JudgedCell(r.aa) + ")"
				}
			}
			out = append(out, []string{r.path, r.metric, f1(r.kernelUs), f1(r.bypassUs), r.ab.String(), r.aa.String(), bench.JudgedCell(r.aa), verdict})
			hooks = append(hooks, idleHookRows(r)...)
		}
		var b strings.Builder
		bench.WriteTable(&b, []string{"path", "metric", "no agent", "agent idle", "agent idle vs no agent", "A/A", "judged", fmt.Sprintf("at most %+.0f%%", idleTarget)}, out)
		fmt.Fprintf(&b, "\nPer hook (BPF run-time statistics, on only in %d more quads per row, not in the A/B's: both nodes' programs in the A/B phases; every run passes: nothing is selected; node-wide hooks (tracepoints) run once per agent, and this lab's two nodes share one kernel; all programs: their time per round trip attached minus detached, per client packet, and the change the row measured in ns per round trip):\n", hookQuads)
		bench.WriteTable(&b, []string{"path", "metric", "program", "runs per round trip, detached", "runs per round trip, attached", "ns per run", "ns per round trip"}, hooks)
		prs := make([]pairedRow, len(rows[mode]))
		for i, r := range rows[mode] {
			prs[i] = r.pairedRow
		}
		writeTasks(&b, prs, "detached", "attached")
		io.WriteString(w, b.String())
	}
}

// idleHookRows are a row's per-program lines and its total.
func idleHookRows(r idleRow) [][]string {
	var out [][]string
	rts := float64(max(r.rts[1], 1))
	// What the programs add: attached minus detached (a program of a link
	// --switch-links keeps runs on both sides).
	var perRT float64
	for _, name := range slices.Sorted(maps.Keys(r.hooks[1])) {
		h := r.hooks[1][name]
		perRT += float64(h.Runtime.Nanoseconds())/rts - float64(r.hooks[0][name].Runtime.Nanoseconds())/float64(max(r.rts[0], 1))
		out = append(out, []string{r.path, r.metric, name, strconv.FormatFloat(float64(r.hooks[0][name].Runs)/float64(max(r.rts[0], 1)), 'f', 2, 64),
			strconv.FormatFloat(float64(h.Runs)/rts, 'f', 2, 64), strconv.FormatFloat(h.NsPerRun(), 'f', 0, 64),
			strconv.FormatFloat(float64(h.Runtime.Nanoseconds())/rts, 'f', 0, 64)})
	}
	measured := r.ab.Median / 100 * r.kernelUs * 1e3
	cell := fmt.Sprintf("%.0f (%.0f per packet, %.1f packets per round trip; measured %+.0f)", perRT, perRT/max(r.pktsPerRT, 1e-9), r.pktsPerRT, measured)
	if r.metric == tcpStream.String() {
		cell = fmt.Sprintf("%.0f (%.0f per packet, %.1f packets per segment)", perRT, perRT/max(r.pktsPerRT, 1e-9), r.pktsPerRT)
	}
	return append(out, []string{r.path, r.metric, "all programs", "", "", "", cell})
}

func f1(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }

// addBystanders adds the pod each node's agent selects with --pair
// idle-unselected, running a server until stop kills and reaps it: the
// agent covers its namespace.
func addBystanders(ctx context.Context, o Options, b *benchLab, w io.Writer) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	for _, n := range []*multinode.Node{b.n1, b.n2} {
		p, err := n.AddPod(bystanderPod+n.Name, true)
		if err != nil {
			return stop, err
		}
		sctx, cancel := context.WithCancel(ctx)
		cmd := p.Cmd(sctx, o.Lab, "workload", "probe-server", "--addr", ":7999")
		if err := p.Start(cmd); err != nil {
			cancel()
			return stop, fmt.Errorf("bystander pod on %s: %w", n.Name, err)
		}
		// Killed and reaped before the lab removes the pod's cgroup,
		// as startServers does.
		stops = append(stops, func() { cancel(); cmd.Wait() })
		fmt.Fprintf(w, "%s: the agent selects pod %s (%s, cgroup %s), which carries no measured flow\n", n.Name, p.Name, p.Addr(o.IPv6), p.Cgroup)
	}
	return stop, nil
}
