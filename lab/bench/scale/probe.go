package scale

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// probeWarmup: unrecorded round trips before the probe's.
const probeWarmup = 1000

// The probe's echo servers in the server pod: probePort accelerated,
// probePlainPort excluded from acceleration (the agent's --exclude-ports),
// so plain TCP between the same pods on the same CPU. The scale servers
// listen from firstPort on.
// probeGaugePort is the gauge's echo server, on the loopback of the gauge
// pod (probe).
const (
	probeGaugePort = 7097
	probePort      = 7099
	probePlainPort = 7098
	firstPort      = 7100
)

// phase is one probe run: 24 B ping-pongs on a fresh connection.
type phase struct {
	cpu        float64 // µs of CPU a message, its client and echo server
	own        float64 // the client's own
	machine    float64 // the whole machine's busy time a message
	agent      float64 // the agent's CPU a message (its periodic work)
	p50, p99   float64 // round trip, µs
	redirected uint64  // messages the datapath redirected meanwhile
	gauge      *phase  // A phases: the gauge's run next to plain TCP's
}

// probe measures the message path at this step, once the machine is quiet
// after the setup (or 10 s passed), after the agent's idle window.
//
// It runs r.o.ProbeQuads quads of probe runs (bench.RunQuads): the A/B pair
// is plain TCP (A, probePlainPort) against the shortcut (B), the A/A pair
// the shortcut twice. The host's drift moves both phases of a pair alike,
// so the paired comparisons resolve what single runs minutes apart cannot
// (their spread was 30 to 95% here). Each A phase also runs the gauge,
// before or after plain TCP's run by turns: the same ping-pong over the
// loopback of a pod whose namespace owns its TCP hash (netlab
// AddLoopbackPod) and has no conntrack rules, so its cost does not move
// with the connections held (plain TCP's does: the host's established hash
// and conntrack table hold them all). The shortcut's runs over the gauge's
// neighbouring runs is the cost a step compares with the first step's,
// the host's drift divided out (cpuGoal).
//
// CPU per message is the CPU time of the processes on the message path
// over the messages: the probe client's from its dial to its close
// (rusage; one client process per target runs all its phases,
// workload.Phases, so no phase pays a process's start) and its echo
// server's (every thread's run time, /proc/<pid>/task/*/schedstat, in ns:
// the 10 ms ticks of /proc/<pid>/stat were as long as a run's server time).
// The redirect runs in their sendmsg calls; other work on the machine does
// not count. Every plain and gauge run must redirect nothing, every
// shortcut run every message (but for the few before its receiver read:
// splice.h), or the step fails.
func (r *run) probe(ctx context.Context, row *Row, ag *agent) error {
	settled, err := bench.Settle(10*time.Second, 0.1)
	if err != nil {
		return err
	}
	if err := r.idle(row, ag); err != nil {
		return err
	}
	pinned, err := datapath.OpenPinned(ag.cfg)
	if err != nil {
		return err
	}
	defer pinned.Close()
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return err
	}
	msgs := float64(2 * (r.o.ProbeN + probeWarmup))
	// One client process for each target, each phase a fresh connection:
	// a process per phase paid its start in every phase's CPU time.
	clients := map[int]*workload.Phases{}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	for port, pod := range map[int]workload.Pod{probePort: r.client, probePlainPort: r.client, probeGaugePort: r.gauge} {
		addr := hostPort(r.server.IPv4, port)
		if port == probeGaugePort {
			addr = hostPort(r.gauge.IPv4, port)
		}
		c, err := r.probeWL.StartPhases(ctx, pod, workload.PingPongArgs{Addr: addr, Size: 24, N: r.o.ProbeN, Warmup: probeWarmup})
		if err != nil {
			return err
		}
		clients[port] = c
	}
	nop := func(bench.Side) error { return nil }
	nA := 0
	q, err := bench.RunQuads(r.o.ProbeQuads, bench.SideB, nop, func(s bench.Side) (phase, error) {
		port, server := probePort, r.probeServer
		var gauge phase
		if s == bench.SideA {
			port, server = probePlainPort, r.plainServer
			if nA++; nA%2 == 0 {
				g, err := r.probeOnce(fs, pinned, ag, clients[probeGaugePort], r.gaugeServer, msgs)
				if err != nil {
					return g, err
				}
				gauge = g
			}
		}
		ph, err := r.probeOnce(fs, pinned, ag, clients[port], server, msgs)
		if err == nil && s == bench.SideA {
			if nA%2 == 1 {
				if gauge, err = r.probeOnce(fs, pinned, ag, clients[probeGaugePort], r.gaugeServer, msgs); err != nil {
					return ph, err
				}
			}
			if gauge.redirected != 0 {
				return ph, fmt.Errorf("probe: the gauge's run had %d messages redirected", gauge.redirected)
			}
			ph.gauge = &gauge
		}
		switch {
		case err != nil:
			return ph, err
		case s == bench.SideA && ph.redirected != 0:
			return ph, fmt.Errorf("probe: the plain TCP run (port %d, excluded) had %d messages redirected", port, ph.redirected)
		case s != bench.SideA && float64(ph.redirected) < 0.99*msgs:
			return ph, fmt.Errorf("probe: the shortcut run redirected %d of %.0f messages", ph.redirected, msgs)
		}
		return ph, nil
	})
	if err != nil {
		return err
	}
	r.summarize(row, q)
	if err := r.progCost(row, ag, fs, pinned, clients, msgs); err != nil {
		return err
	}
	fmt.Fprintf(r.o.Log, "  probe (after %.1f s settling, %d quads): RTT p50 %.1f µs (plain %.1f), CPU a message %.2f µs (plain %.2f; the client's own %.2f, the agent's %.2f, the machine's %.2f); shortcut vs plain %s, A/A %s; its programs %.0f ns a message %s; the agent idle: %.1f%% of a CPU, its RSS at most %.1f MB so far\n",
		settled.Seconds(), r.o.ProbeQuads, row.RTT.P50, row.PlainRTTP50, row.CPUPerMsg, row.PlainCPUPerMsg, row.ProbeCPUPerMsg, median(row.AgentCPUPerMsgRuns), row.MachineCPUPerMsg,
		row.CPUVsPlain.Cell(), row.CPUAA.Cell(), row.ProgNsPerMsg, progNames(row.ProgNs), 100*row.AgentIdleCPU, mb(row.AgentRSSPeak))
	return nil
}

// idle takes the agent's CPU over the idle window, the connections idle:
// its periodic scans and walks; and its RSS peak so far.
func (r *run) idle(row *Row, ag *agent) error {
	start, err := cpuSeconds(ag.cmd.Process.Pid)
	if err != nil {
		return err
	}
	time.Sleep(r.o.IdleWindow)
	end, err := cpuSeconds(ag.cmd.Process.Pid)
	if err != nil {
		return err
	}
	row.AgentIdleCPU = (end - start) / r.o.IdleWindow.Seconds()
	row.AgentRSSPeak, err = bench.ProcRSSPeak(ag.cmd.Process.Pid)
	return err
}

// probeOnce runs one phase of client c, whose echo server is pid server,
// msgs messages in all.
func (r *run) probeOnce(fs procfs.FS, pinned *datapath.Pinned, ag *agent, c *workload.Phases, server int, msgs float64) (phase, error) {
	var ph phase
	// The counters around the phase: the machine's busy time, the echo
	// server's and the agent's CPU, the messages redirected.
	read := func() (busy, srv, agent float64, red uint64, err error) {
		if busy, err = bench.SystemBusy(fs); err != nil {
			return
		}
		if srv, err = cpuSeconds(server); err != nil {
			return
		}
		if agent, err = cpuSeconds(ag.cmd.Process.Pid); err != nil {
			return
		}
		c, err := datapath.ReadCounters(pinned.Counters)
		return busy, srv, agent, c["messages_redirected"], err
	}
	busy0, srv0, agent0, red0, err := read()
	if err != nil {
		return ph, err
	}
	res, err := c.Run()
	if err != nil {
		return ph, fmt.Errorf("probe: %w", err)
	}
	busy1, srv1, agent1, red1, err := read()
	if err != nil {
		return ph, err
	}
	// Threads that exit take their run time out of the sums (cpuSeconds):
	// the server's must grow, or its part is not measured.
	if srv1 <= srv0 || res.CPUSeconds <= 0 {
		return ph, fmt.Errorf("probe: CPU time did not grow over a phase (echo server pid %d: %v to %v s; client %v s)", server, srv0, srv1, res.CPUSeconds)
	}
	ph.cpu, ph.own = (res.CPUSeconds+srv1-srv0)*1e6/msgs, res.CPUSeconds*1e6/msgs
	ph.machine, ph.agent = (busy1-busy0)*1e6/msgs, (agent1-agent0)*1e6/msgs
	ph.p50, ph.p99, ph.redirected = res.Micros.P50, res.Micros.P99, red1-red0
	return ph, nil
}

// summarize fills the row's probe columns from the quads: the shortcut's
// values are those of all its phases (A/A pair and B), plain TCP's those of
// A.
func (r *run) summarize(row *Row, q bench.Quads[phase]) {
	pick := func(sides []bench.Side, f func(phase) float64) []float64 {
		var out []float64
		for _, s := range sides {
			for _, ph := range q[s] {
				out = append(out, f(ph))
			}
		}
		return out
	}
	sc, plain := []bench.Side{bench.SideAA1, bench.SideAA2, bench.SideB}, []bench.Side{bench.SideA}
	all := append(slices.Clone(sc), plain...)
	cpu := func(ph phase) float64 { return ph.cpu }
	row.CPUPerMsgRuns, row.PlainCPUPerMsgRuns = pick(sc, cpu), pick(plain, cpu)
	row.CPUPerMsg, row.PlainCPUPerMsg = median(row.CPUPerMsgRuns), median(row.PlainCPUPerMsgRuns)
	row.ProbeCPUPerMsg = median(pick(sc, func(ph phase) float64 { return ph.own }))
	row.MachineCPUPerMsg = median(pick(sc, func(ph phase) float64 { return ph.machine }))
	row.AgentCPUPerMsgRuns = pick(all, func(ph phase) float64 { return ph.agent })
	row.RTT = rttStats{P50: median(pick(sc, func(ph phase) float64 { return ph.p50 })), P99: median(pick(sc, func(ph phase) float64 { return ph.p99 }))}
	row.PlainRTTP50 = median(pick(plain, func(ph phase) float64 { return ph.p50 }))
	row.CPUVsPlain = bench.TryPaired(pick([]bench.Side{bench.SideA}, cpu), pick([]bench.Side{bench.SideB}, cpu), uint64(row.Conns))
	row.CPUAA = bench.TryPaired(pick([]bench.Side{bench.SideAA1}, cpu), pick([]bench.Side{bench.SideAA2}, cpu), uint64(row.Conns)+1)
	// Quad i's gauge run is in its A phase, next to its B phase.
	gauge := make([]float64, 0, len(q[bench.SideA]))
	for i, a := range q[bench.SideA] {
		gauge = append(gauge, a.gauge.cpu)
		row.CPUOverGauge = append(row.CPUOverGauge, q[bench.SideB][i].cpu/a.gauge.cpu)
		row.PlainOverGauge = append(row.PlainOverGauge, a.cpu/a.gauge.cpu)
	}
	row.GaugeCPUPerMsg = median(gauge)
}

// cpuSeconds is the run time of every thread of the processes so far
// (/proc/<pid>/task/*/schedstat, ns). A thread that exited is not counted:
// the probe's echo servers keep their threads (workload's echoConn
// unlocks its thread before it ends), as the agent does.
func cpuSeconds(pids ...int) (float64, error) {
	var cpu time.Duration
	for _, pid := range pids {
		s, err := bench.ProcessTasks(pid).Snap()
		if err != nil {
			return 0, err
		}
		cpu += s.Total().CPU
	}
	return cpu.Seconds(), nil
}

// progCost runs progPairs more pairs of phases: a shortcut run with the
// kernel's BPF run-time statistics on (their clock reads cost every program
// a little, so not in the timed quads; bench.Progs.During), whose programs' run time per
// message is the datapath's own cost per message (which the CPU time of
// the probe's processes holds among much else), and a gauge run, by turns
// first; each pair's programs' time over its gauge's CPU per message is
// that cost with the host's drift divided out (cpuGoal's way, for the
// programs: progGoal).
func (r *run) progCost(row *Row, ag *agent, fs procfs.FS, pinned *datapath.Pinned, clients map[int]*workload.Phases, msgs float64) error {
	progs, err := bench.OpenNewProgs("ez_", ag.before)
	if err != nil {
		return err
	}
	defer progs.Close()
	byName := map[string]bench.ProgStat{}
	row.ProgNsRuns, row.ProgOverGauge = nil, nil
	gauge := func() (phase, error) {
		return r.probeOnce(fs, pinned, ag, clients[probeGaugePort], r.gaugeServer, msgs)
	}
	for i := range progPairs {
		var g, ph phase
		if i%2 == 0 {
			if g, err = gauge(); err != nil {
				return err
			}
		}
		// Statistics on for the shortcut's run only, as in the quads'
		// gauge runs.
		ran, err := progs.During(func() (err error) {
			ph, err = r.probeOnce(fs, pinned, ag, clients[probePort], r.probeServer, msgs)
			return err
		})
		if err != nil {
			return fmt.Errorf("probe with BPF statistics: %w", err)
		}
		if float64(ph.redirected) < 0.99*msgs {
			return fmt.Errorf("probe with BPF statistics: %d of %.0f messages redirected", ph.redirected, msgs)
		}
		if i%2 == 1 {
			if g, err = gauge(); err != nil {
				return err
			}
		}
		var ns float64
		for name, d := range ran {
			if agentRuns[name] {
				continue
			}
			byName[name] = byName[name].Add(d)
			ns += float64(d.Runtime.Nanoseconds()) / msgs
		}
		row.ProgNsRuns = append(row.ProgNsRuns, ns)
		row.ProgOverGauge = append(row.ProgOverGauge, ns/(1000*g.cpu))
	}
	row.ProgNs = map[string]float64{}
	for name, d := range byName {
		if d.Runs > 0 {
			row.ProgNs[name] = float64(d.Runtime.Nanoseconds()) / (msgs * progPairs)
		}
	}
	row.ProgNsPerMsg = median(row.ProgNsRuns)
	return nil
}

// progPairs: the pairs of phases progCost runs.
const progPairs = 40

// agentRuns are the programs the agent runs itself (iterators and test
// runs: its adoption scan, releases, listings), whose runs may fall in a
// phase but are not on the message path: progCost leaves them out.
var agentRuns = map[string]bool{"ez_sc_adopt_scan": true, "ez_sc_adopt_step": true, "ez_sc_release": true,
	"ez_sc_release_switched": true, "ez_sc_conns": true, "ez_sc_conns_all": true}

// progNames lists ns a message by program, largest first.
func progNames(ns map[string]float64) string {
	names := slices.Collect(maps.Keys(ns))
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(ns[b], ns[a]) })
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.0f", n, ns[n]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
