package bypass

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	"github.com/eztunnel/eztunnel/internal/netprobe"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
	"golang.org/x/sys/unix"
)

// Paired mode (--pairs N): the bypass and the kernel path compared on the
// same established flows, not in rounds of seconds. One connection (TCP)
// or connected socket (UDP) in the client pod runs round trips back to
// back on one thread; between two round trips, when none of its packets is
// in flight, that thread flips the bypass's switch on both nodes
// (bypass.Switch: paused, every packet takes the kernel path with the
// programs attached). Time is cut into phases of --phase; pairs of phases
// alternate in quads: an A/A pair (the bypass in both phases) and an A/B
// pair (paused, bypass), in bench.QuadOrder (a linear drift, and what a
// flip leaves behind, fall on both sides alike), each phase summarised by
// its median round trip. Each row's quads run in blocks (--blocks), the
// rows' blocks interleaved (block 1 of every row, then block 2, ...), each
// block on flows opened for it: a row is measured over the whole run and
// on as many flows as blocks. The report gives, per path and protocol,
// the median of the paired differences with its 95% bootstrap interval
// (resampling whole blocks: bench.ComparePairedBlocks) for the A/B pairs
// and for the A/A pairs, which must hold 0 and be within
// ±bench.AAMaxHalfWidth, else the row says it judges nothing.

// udpTimeout is how long a paired UDP round trip waits for its echo.
const udpTimeout = 20 * time.Millisecond

// crossNode is the path to the server pod on the other node.
const crossNode = "cross-node"

// pairedKind is what a paired row measures.
type pairedKind int

const (
	tcpRTT    pairedKind = iota // back-to-back 24 B TCP round trips on one connection
	udpRTT                      // back-to-back 24 B UDP round trips on one socket
	tcpStream                   // one TCP stream per phase, opened at its start (goodput)
)

func (k pairedKind) String() string {
	return [...]string{"TCP RTT p50 (us)", "UDP RTT p50 (us)", "TCP stream (Gbit/s)"}[k]
}

// rawName is k in --raw's CSV.
func (k pairedKind) rawName() string {
	return [...]string{"tcp-rtt-us", "udp-rtt-us", "tcp-stream-gbps"}[k]
}

// pairedKinds are the rows of a path: the round trips on both paths, and
// a single stream cross-node (issue 37's target: not below the bridge).
// A stream switches path only between phases, when it is drained (every
// byte written acknowledged: workload.Sink), so no segment on the faster
// path can overtake one still queued on the slower; one connection per
// block, its congestion window kept from phase to phase (a connection per
// phase, as before, measured much of its handshake and slow start: its
// A/A pairs' differences spread by 10.8% (sd), one connection's by 6.8%,
// in two host-gw runs of 2026-12-01 and -02).
func pairedKinds(path string) []pairedKind {
	if path == crossNode {
		return []pairedKind{tcpRTT, udpRTT, tcpStream}
	}
	return []pairedKind{tcpRTT, udpRTT}
}

// pairedRow is one path and protocol of a paired run.
type pairedRow struct {
	path, metric string
	ab, aa       bench.Paired
	// Medians over the phases (us; Gbit/s for a stream): the kernel path
	// (paused) and the bypass, in the A/B pairs.
	kernelUs, bypassUs float64
	roundTrips, lost   int
	// The bypass's programs in the A/B phases, [0] the kernel path
	// (paused: every run passes), [1] the bypass (runs act or pass), by
	// program name; rts the round trips completed in those phases.
	hooks [2]map[string]bench.ProgStat
	rts   [2]int
	// tasks: what the tasks on the path ran in the A/B phases ([0] A, [1]
	// B), by pathTasks's names; taskRTs their round trips.
	tasks   [2]map[string]bench.TaskStat
	taskRTs [2]int
	// blockAB: each block's median A/B difference (percent).
	blockAB []float64
}

// phaseStat is one phase's median round trip (us) and how many it had;
// for a stream its goodput (Gbit/s) and the segments it sent.
type phaseStat struct {
	median float64
	n      int
}

// roundTripper is one round trip of a ping-pong: ok false when lost.
type roundTripper func() (time.Duration, bool, error)

// phaser measures one phase of d.
type phaser func(d time.Duration, row *pairedRow) (phaseStat, error)

// runPairedModes is Run in paired mode: per mode a lab, the bypass agents
// started once, every path and protocol paired.
func runPairedModes(ctx context.Context, o Options, w io.Writer) error {
	if o.Phase < 10*time.Millisecond || o.Pairs < 20 {
		return fmt.Errorf("bench bypass --pairs %d (>= 20) --phase %s (>= 10ms)", o.Pairs, o.Phase)
	}
	if len(o.Modes) == 0 {
		return errors.New("bench bypass: no routing mode")
	}
	if _, err := pairedBlocks(o); err != nil {
		return err
	}
	switch o.Pair {
	case PairIdle, PairIdleNarrow, PairIdleUnselected:
		return runIdlePairedModes(ctx, o, w)
	case "", PairBypass:
		if o.TCHooksOn {
			return fmt.Errorf("bench bypass --tc-hooks-on: only with --pair %s, %s or %s", PairIdle, PairIdleNarrow, PairIdleUnselected)
		}
		if o.SwitchLinks != "" {
			return fmt.Errorf("bench bypass --switch-links: only with --pair %s, %s or %s", PairIdle, PairIdleNarrow, PairIdleUnselected)
		}
	default:
		return fmt.Errorf("bench bypass --pair %q: not %s, %s, %s or %s", o.Pair, PairBypass, PairIdle, PairIdleNarrow, PairIdleUnselected)
	}
	fmt.Fprintf(w, "eztunnel bench bypass --pairs %d --phase %s: %d mode(s); client on CPU %s (the measuring thread), servers on CPU %s; IPv6 %v\n",
		o.Pairs, o.Phase, len(o.Modes), cpuName(o.ClientCPU), cpuName(o.ServerCPU), o.IPv6)
	raw, closeRaw, err := openRaw(o)
	if err != nil {
		return err
	}
	defer closeRaw()
	rows := map[multinode.Mode][]pairedRow{}
	for _, mode := range o.Modes {
		err := withLab(ctx, o, mode, w, func(b *benchLab) error {
			a, err := startAgents(ctx, o, Bypass, b.tmp, b.n1, b.n2)
			if err != nil {
				return err
			}
			// Run-time statistics on for the whole paired run: both
			// phases pay their clock reads alike.
			statsOn, err := bench.EnableProgStats()
			if err != nil {
				a.stop()
				return err
			}
			defer statsOn.Close()
			progs, err := bench.OpenProgs(bypass.ProgPrefix)
			if err != nil {
				a.stop()
				return err
			}
			defer progs.Close()
			r, err := runPaired(ctx, o, b.client, b.servers, a, progs, w, rawMode(raw, PairBypass, o.rawSetup(), mode))
			if serr := a.stop(); err == nil {
				err = serr
			}
			rows[mode] = r
			return err
		})
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
	}
	reportPaired(w, o, rows)
	return nil
}

// rawHeader is the first line of --raw's CSV.
var rawHeader = []string{"pair", "setup", "mode", "path", "metric", "block", "quad", "side", "value"}

// rawSetup is what, besides the pair, makes A and B what they are in a
// run (--raw's setup column): the pods' address family, the phase, and for
// the idle pairs the tc hooks held on and the links switched. Runs pool
// only with runs of the same setup (bench pool).
func (o Options) rawSetup() string {
	s := "ipv4"
	if o.IPv6 {
		s = "ipv6"
	}
	s += " phase=" + o.Phase.String()
	if o.TCHooksOn {
		s += " tc-hooks-on"
	}
	if o.SwitchLinks != "" {
		s += " switch-links=" + o.SwitchLinks
	}
	return s
}

// openRaw creates --raw's file with its header (no file: a nil writer);
// closeRaw closes it.
func openRaw(o Options) (raw *csv.Writer, closeRaw func(), err error) {
	if o.Raw == "" {
		return nil, func() {}, nil
	}
	f, err := os.Create(o.Raw)
	if err != nil {
		return nil, nil, fmt.Errorf("bench bypass --raw: %w", err)
	}
	raw = csv.NewWriter(f)
	if err := raw.Write(rawHeader); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("bench bypass --raw: %w", err)
	}
	return raw, func() { f.Close() }, nil
}

// rawMode writes a row's phases to raw (nil: nothing), one line per phase
// in the order it ran: the pair (--pair), the setup (rawSetup), block and
// quad from 0, side A (the kernel path, or no agent), B, AA1 or AA2 (the
// bypass, or the idle agent), value the phase's median round trip (us) or
// goodput (Gbit/s).
func rawMode(raw *csv.Writer, pair, setup string, mode multinode.Mode) func(*pairedRun) error {
	return func(r *pairedRun) error {
		if raw == nil {
			return nil
		}
		for blk := range r.quads[bench.SideA] {
			for q := range r.quads[bench.SideA][blk] {
				for _, s := range bench.QuadOrder(q) {
					v := strconv.FormatFloat(r.quads[s][blk][q], 'g', -1, 64)
					if err := raw.Write([]string{pair, setup, string(mode), r.row.path, r.kind.rawName(), strconv.Itoa(blk), strconv.Itoa(q), s.String(), v}); err != nil {
						return err
					}
				}
			}
		}
		raw.Flush()
		return raw.Error()
	}
}

// pairedBlocks is how many blocks the quads of each row run in (Options.Blocks).
func pairedBlocks(o Options) (int, error) {
	k := o.Blocks
	if k == 0 {
		k = max(o.Pairs/20, 1)
		for o.Pairs%k != 0 || o.Pairs/k < 4 {
			k--
		}
	}
	if k < 1 || o.Pairs%k != 0 || o.Pairs/k < 4 {
		return 0, fmt.Errorf("bench bypass --blocks %d: must divide --pairs %d into blocks of at least 4 quads", o.Blocks, o.Pairs)
	}
	return k, nil
}

// pairedRun is one row under way: its blocks' phases, by side.
type pairedRun struct {
	row    pairedRow
	kind   pairedKind
	server *multinode.Pod
	// quads[side][block]: the phases' statistics of that block.
	quads            [4][][]float64
	bypassed, paused float64
}

// runPaired measures the paired rows of one mode with the bypass agents
// running; the switches are the agents' (one per node). The rows' blocks
// are interleaved (block 1 of every row, then block 2, ...), so each row
// is measured across the whole run and on as many flows as blocks.
func runPaired(ctx context.Context, o Options, client *multinode.Pod, servers map[string]*multinode.Pod, a *agents, progs *bench.Progs, w io.Writer, raw func(*pairedRun) error) ([]pairedRow, error) {
	blocks, err := pairedBlocks(o)
	if err != nil {
		return nil, err
	}
	flip, closeSwitches, err := a.OpenSwitches()
	if err != nil {
		return nil, err
	}
	defer closeSwitches() // the bypass on again, then closed
	var runs []*pairedRun
	for _, path := range paths {
		for _, kind := range pairedKinds(path) {
			r := newPairedRun(kind, servers[path])
			r.row.path = path
			runs = append(runs, r)
		}
	}
	err = interleaveBlocks(ctx, o, client, runs, blocks, flip, progs, func(r *pairedRun, block func() error) error {
		b0, _, f0, err := a.counters()
		if err != nil {
			return err
		}
		if err := block(); err != nil {
			return err
		}
		b1, _, f1, err := a.counters()
		if err != nil {
			return err
		}
		r.bypassed += b1 - b0
		r.paused += f1["paused"] - f0["paused"]
		return nil
	})
	if err != nil {
		return nil, err
	}
	var rows []pairedRow
	for _, r := range runs {
		if err := r.finish(); err != nil {
			return nil, fmt.Errorf("%s, %s: %w", r.row.path, r.kind, err)
		}
		if err := raw(r); err != nil {
			return nil, fmt.Errorf("bench bypass --raw: %w", err)
		}
		row := r.row
		rows = append(rows, row)
		fmt.Fprintf(w, "paired %-10s %-19s A/B %s  A/A %s  (kernel path %.1f, bypass %.1f; %d round trips or streams, %d lost; blocks' A/B medians %s)\n",
			row.path, row.metric, row.ab, row.aa, row.kernelUs, row.bypassUs, row.roundTrips, row.lost, spread(row.blockAB))
	}
	return rows, nil
}

// interleaveBlocks runs blocks blocks of each run's quads, the runs'
// blocks interleaved (block 1 of every run, then block 2, ...), so each
// run is measured across the whole bench and on as many flows as blocks.
// The first block's flows warm up for longer: the first packets of a path
// (neighbours, routes) are its. around, if not nil, runs each block
// (block) with what it measures around it.
func interleaveBlocks(ctx context.Context, o Options, client *multinode.Pod, runs []*pairedRun, blocks int, flip func(bool) error, progs *bench.Progs, around func(r *pairedRun, block func() error) error) error {
	for blk := range blocks {
		for _, r := range runs {
			if err := ctx.Err(); err != nil {
				return err
			}
			warm := o.Phase
			if blk == 0 {
				warm = 500 * time.Millisecond
			}
			block := func() error { return pairedBlock(o, client, r, o.Pairs/blocks, warm, flip, progs) }
			var err error
			if around != nil {
				err = around(r, block)
			} else {
				err = block()
			}
			if err != nil {
				return fmt.Errorf("%s, %s, block %d: %w", r.row.path, r.kind, blk+1, err)
			}
		}
	}
	return nil
}

func newPairedRun(kind pairedKind, server *multinode.Pod) *pairedRun {
	r := &pairedRun{kind: kind, server: server}
	r.row.metric = kind.String()
	r.row.hooks = [2]map[string]bench.ProgStat{{}, {}}
	r.row.tasks = [2]map[string]bench.TaskStat{{}, {}}
	return r
}

// pairedOne runs the quads of one path and protocol in one block, on one
// flow (the idle rows' per-hook pass).
func pairedOne(o Options, client, server *multinode.Pod, kind pairedKind, flip func(bool) error, progs *bench.Progs) (pairedRow, error) {
	r := newPairedRun(kind, server)
	if err := pairedBlock(o, client, r, o.Pairs, 500*time.Millisecond, flip, progs); err != nil {
		return r.row, err
	}
	err := r.compare()
	return r.row, err
}

// finish checks that both paths were taken and computes the row's
// comparisons from its blocks.
func (r *pairedRun) finish() error {
	// A comparison where nothing was bypassed, or nothing paused,
	// compared nothing.
	if r.bypassed == 0 || r.paused == 0 {
		return fmt.Errorf("bypassed %v, paused %v packets: the two paths were not both taken", r.bypassed, r.paused)
	}
	return r.compare()
}

// compare computes the row's comparisons from its blocks.
func (r *pairedRun) compare() error {
	q := r.quads
	seed := quadsSeed(&q)
	var err error
	if r.row.ab, err = bench.ComparePairedBlocks(q[bench.SideA], q[bench.SideB], seed); err != nil {
		return err
	}
	if r.row.aa, err = bench.ComparePairedBlocks(q[bench.SideAA1], q[bench.SideAA2], seed); err != nil {
		return err
	}
	r.row.blockAB = bench.BlockMedians(q[bench.SideA], q[bench.SideB])
	k, b := slices.Concat(q[bench.SideA]...), slices.Concat(q[bench.SideB]...)
	slices.Sort(k)
	slices.Sort(b)
	r.row.kernelUs, r.row.bypassUs = stats.Quantile(k, 0.5), stats.Quantile(b, 0.5)
	return nil
}

// quadsSeed seeds a row's bootstrap: its number of A/A phases, so its
// intervals can be recomputed from the report's data (--raw, bench pool).
func quadsSeed(q *[4][][]float64) uint64 {
	return uint64(len(slices.Concat(q[bench.SideAA1]...)))
}

// spread is "-26.1 .. -24.9" for the blocks' medians, "-" without any.
func spread(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f .. %+.1f", slices.Min(xs), slices.Max(xs))
}

// pairedBlock runs one block of n quads of r's path and protocol on fresh
// flows, on one thread in the client's namespace (pinned to the client
// CPU), warmed up for warm.
func pairedBlock(o Options, client *multinode.Pod, r *pairedRun, n int, warm time.Duration, flip func(bool) error, progs *bench.Progs) error {
	row := &r.row
	// Phases in bench.QuadOrder: A the kernel path (paused), B and both
	// A/A phases the bypass.
	var quads bench.Quads[phaseStat]
	err := client.Do(func() error {
		if o.ClientCPU >= 0 {
			restore, err := netprobe.PinThread(o.ClientCPU)
			if err != nil {
				return err
			}
			defer restore()
		}
		measure, closePh, err := dialPhaser(r.server.Addr(o.IPv6), r.kind)
		if err != nil {
			return err
		}
		defer closePh()
		// Warm-up on the bypass: the flow established and admitted.
		rts, lost := row.roundTrips, row.lost
		if _, err := measure(warm, row); err != nil {
			return err
		}
		row.roundTrips, row.lost = rts, lost
		// After the warm-up: the server's thread of this connection may
		// be one it started for it.
		tasks, err := pathTasks(unix.Gettid(), r.server)
		if err != nil {
			return err
		}
		set := func(dp bench.Side) error { return flip(dp == bench.SideA) }
		quads, err = bench.RunQuads(n, bench.SideB, set, func(side bench.Side) (phaseStat, error) {
			return measuredPhase(o, side, measure, row, tasks, progs)
		})
		if err != nil {
			return err
		}
		return flip(false)
	})
	if err != nil {
		return err
	}
	for s, ps := range quads {
		med := make([]float64, len(ps))
		for i, p := range ps {
			med[i] = p.median
		}
		r.quads[s] = append(r.quads[s], med)
	}
	return nil
}

// measuredPhase measures one phase of side; in an A/B phase it also adds
// what its programs and the path's tasks ran to row.
func measuredPhase(o Options, side bench.Side, measure phaser, row *pairedRow, tasks taskSet, progs *bench.Progs) (phaseStat, error) {
	ab := side == bench.SideA || side == bench.SideB // an A/B phase: its programs' runs are counted
	var st0 map[string]bench.ProgStat
	var tk0 map[string]bench.Snapshot
	var err error
	if ab {
		if st0, err = progs.Read(); err != nil {
			return phaseStat{}, err
		}
		if tk0, err = tasks.read(); err != nil {
			return phaseStat{}, err
		}
	}
	s, err := measure(o.Phase, row)
	if err != nil || !ab {
		return s, err
	}
	tk1, err := tasks.read()
	if err != nil {
		return s, err
	}
	st1, err := progs.Read()
	if err != nil {
		return s, err
	}
	k := 1
	if side == bench.SideA {
		k = 0
	}
	for name, v := range tk1 {
		row.tasks[k][name] = row.tasks[k][name].Add(v.Since(tk0[name]))
	}
	row.taskRTs[k] += s.n
	for name, v := range st1 {
		row.hooks[k][name] = row.hooks[k][name].Add(v.Sub(st0[name]))
	}
	row.rts[k] += s.n
	return s, nil
}

// phase runs round trips for d and returns their median; a phase without
// any completed round trip is an error.
func phase(rt roundTripper, d time.Duration, row *pairedRow) (phaseStat, error) {
	var us []float64
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		x, ok, err := rt()
		if err != nil {
			return phaseStat{}, err
		}
		row.roundTrips++
		if !ok {
			row.lost++
			continue
		}
		us = append(us, float64(x.Nanoseconds())/1e3)
	}
	if len(us) == 0 {
		return phaseStat{}, errors.New("a phase without a single completed round trip")
	}
	slices.Sort(us)
	return phaseStat{median: stats.Quantile(us, 0.5), n: len(us)}, nil
}

// dialPhaser opens what the phases of kind measure, from the calling
// thread's namespace to the server at addr.
func dialPhaser(addr netip.Addr, kind pairedKind) (phaser, func(), error) {
	if kind == tcpStream {
		sink, err := workload.DialSink(netip.AddrPortFrom(addr, streamPort).String())
		if err != nil {
			return nil, nil, err
		}
		return func(d time.Duration, row *pairedRow) (phaseStat, error) {
			gbps, segs, err := sink.Phase(d)
			if err != nil {
				return phaseStat{}, err
			}
			row.roundTrips++
			// n: the segments sent, so the per-hook table counts runs
			// per segment for a stream.
			return phaseStat{median: gbps, n: int(segs)}, nil
		}, func() { sink.Close() }, nil
	}
	port := echoPort
	if kind == udpRTT {
		port = udpPort
	}
	rt, closeRT, err := dialRoundTripper(netip.AddrPortFrom(addr, uint16(port)), kind == udpRTT)
	if err != nil {
		return nil, nil, err
	}
	return func(d time.Duration, row *pairedRow) (phaseStat, error) { return phase(rt, d, row) }, closeRT, nil
}

// dialRoundTripper connects from the calling thread's namespace to an echo
// server: TCP (workload serve --echo) or UDP (workload udp --serve).
func dialRoundTripper(to netip.AddrPort, udp bool) (roundTripper, func(), error) {
	if udp {
		fd, err := workload.RawUDPDial(to.String())
		if err != nil {
			return nil, nil, err
		}
		u, err := workload.NewUDPPinger(fd, 24, udpTimeout)
		if err != nil {
			unix.Close(fd)
			return nil, nil, err
		}
		return u.RoundTrip, func() { unix.Close(fd) }, nil
	}
	fd, err := workload.RawDial(to.String())
	if err != nil {
		return nil, nil, err
	}
	pp, err := workload.NewPingPonger(fd, 24)
	if err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	return func() (time.Duration, bool, error) {
		d, err := pp.RoundTrip()
		return d, err == nil, err
	}, func() { unix.Close(fd) }, nil
}

// reportPaired prints the paired rows of every mode.
func reportPaired(w io.Writer, o Options, rows map[multinode.Mode][]pairedRow) {
	blocks, _ := pairedBlocks(o)
	fmt.Fprintf(w, "\nPaired: the bypass (B) vs its kernel path (A, the bypass paused with its programs attached) on the same flows; %d quads of %s phases (an A/A pair, the bypass on both sides, and an A/B pair) in %d blocks, the rows' blocks interleaved over the run, each block on fresh flows; median of the per-pair differences of the phases' median round trip, with its 95%% bootstrap interval (resampling whole blocks: it holds the spread between blocks; expanded percentile tails for their number); a row judges only if its A/A interval holds 0 and is within ±%.0f%%\n",
		o.Pairs, o.Phase, blocks, bench.AAMaxHalfWidth)
	for _, mode := range o.Modes {
		fmt.Fprintf(w, "\n%s (IPv6 %v):\n", mode, o.IPv6)
		var out [][]string
		for _, r := range rows[mode] {
			judged := bench.JudgedCell(r.aa)
			out = append(out, []string{r.path, r.metric, strconv.FormatFloat(r.kernelUs, 'f', 1, 64), strconv.FormatFloat(r.bypassUs, 'f', 1, 64),
				r.ab.String(), r.aa.String(), judged})
		}
		var b strings.Builder
		bench.WriteTable(&b, []string{"path", "metric", "kernel path", "bypass", "bypass vs kernel path", "A/A", "judged"}, out)
		fmt.Fprintf(&b, "\nPer hook (BPF run-time statistics, both nodes' programs; kernel path: every run passes, bypass: runs act or pass; a stream's \"round trip\" is a segment sent):\n")
		bench.WriteTable(&b, []string{"path", "metric", "program", "runs per round trip, kernel path", "ns per run, kernel path", "runs per round trip, bypass", "ns per run, bypass", "ns per round trip, bypass"}, hookRows(rows[mode]))
		writeTasks(&b, rows[mode], "kernel path", "bypass")
		io.WriteString(w, b.String())
	}
}

// hookRows are the per-program rows of the report: runs per round trip and
// ns per run in each kind of A/B phase.
func hookRows(rows []pairedRow) [][]string {
	var out [][]string
	for _, r := range rows {
		names := slices.Sorted(maps.Keys(r.hooks[1]))
		for _, name := range names {
			cells := []string{r.path, r.metric, name}
			for k := range 2 {
				h, rts := r.hooks[k][name], max(r.rts[k], 1)
				cells = append(cells, strconv.FormatFloat(float64(h.Runs)/float64(rts), 'f', 2, 64), strconv.FormatFloat(h.NsPerRun(), 'f', 0, 64))
			}
			h := r.hooks[1][name]
			cells = append(cells, strconv.FormatFloat(float64(h.Runtime.Nanoseconds())/float64(max(r.rts[1], 1)), 'f', 0, 64))
			out = append(out, cells)
		}
	}
	return out
}

// The tasks on a measured path, by name (the client and the servers share
// a CPU by default: how they are scheduled is part of the round trip).
const (
	taskClient   = "client (the measuring thread)"
	taskServer   = "server pod (its threads)"
	taskSoftirqd = "softirq threads (ksoftirqd/N)"
)

// taskSet reads the tasks on a path together.
type taskSet map[string]*bench.Tasks

// pathTasks are the measuring thread tid, the server pod's threads and the
// softirq threads.
func pathTasks(tid int, server *multinode.Pod) (taskSet, error) {
	sirq, err := bench.OpenSoftirqd()
	if err != nil {
		return nil, err
	}
	srv, err := bench.CgroupTasks(server.Cgroup)
	if err != nil {
		return nil, err
	}
	return taskSet{taskClient: bench.Thread(tid), taskServer: srv, taskSoftirqd: sirq}, nil
}

func (ts taskSet) read() (map[string]bench.Snapshot, error) {
	out := make(map[string]bench.Snapshot, len(ts))
	for name, t := range ts {
		st, err := t.Snap()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = st
	}
	return out, nil
}

// writeTasks prints the tasks on each row's path in its A/B phases, the A
// phases labelled a and the B phases b.
func writeTasks(w *strings.Builder, rows []pairedRow, a, b string) {
	fmt.Fprintf(w, "\nThe tasks on the path, in every A/B phase (/proc/TID/schedstat: a timeslice is a wake-up or the return from a preemption; wait is time runnable on a run queue; the softirq threads run receive work a CPU left unfinished, because a task needed the CPU or 2 ms passed):\n")
	var out [][]string
	for _, r := range rows {
		for _, name := range []string{taskClient, taskServer, taskSoftirqd} {
			cell := func(k int, v func(bench.TaskStat) float64) string {
				return strconv.FormatFloat(v(r.tasks[k][name])/float64(max(r.taskRTs[k], 1)), 'f', 1, 64)
			}
			slices1000 := func(s bench.TaskStat) float64 { return 1000 * float64(s.Slices) }
			cpu := func(s bench.TaskStat) float64 { return float64(s.CPU.Nanoseconds()) }
			wait := func(s bench.TaskStat) float64 { return float64(s.Wait.Nanoseconds()) }
			out = append(out, []string{r.path, r.metric, name, cell(0, slices1000), cell(1, slices1000), cell(0, cpu), cell(1, cpu), cell(0, wait), cell(1, wait)})
		}
	}
	bench.WriteTable(w, []string{"path", "metric", "task", "timeslices per 1000 round trips, " + a, b, "CPU ns per round trip, " + a, b, "wait ns per round trip, " + a, b}, out)
}
