package mesh

// The paired ping-echo (--b2b-pairs N, --quick's back-to-back ping-echo):
// instead of rounds of runs under each datapath, one datapath is installed
// for the whole comparison and the client alternates, phase by phase in
// the quads of bench.QuadOrder (an A/A pair, both phases A, and an A/B
// pair), between two sets of fresh connections through the same chain:
//
//   - A (kernel path): connections to the echo server's second port
//     (meshlab.PortEchoKernel), every one of whose legs has a server port
//     the datapath excludes (meshlab.KernelPathPorts: the sidecars' second
//     listeners, the node proxy's second inbound listener);
//   - B (shortcut): connections to the echo port (meshlab.PortEcho).
//
// Both cross the same processes (the same echo server, the same HAProxy
// frontends and backends) and hops; they differ only in the ports and
// whether the shortcut takes them. Switching a connection between the two
// paths in place would break its byte order, hence fresh connections per
// phase. Every phase's counter deltas are checked: a B phase must pair
// connections and redirect messages, an A (or A/A) phase neither.
// A phase is the median round trip of its messages (24 B, one at a time,
// the connections in turn); the comparison is the median of the per-quad
// differences with its 95% bootstrap interval, and the A/A row's.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/naivesockmap"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// PairedB2B is one mesh's paired ping-echo: paired/<mesh>.json.
type PairedB2B struct {
	Mesh string `json:"mesh"`
	// What B took: PairEztunnel ("" in results of before the choice) or
	// PairNaive.
	Datapath string        `json:"datapath,omitempty"`
	Quads    int           `json:"quads"`
	Phase    time.Duration `json:"phase_ns"`
	Conns    int           `json:"conns"` // fresh connections per phase
	Size     int           `json:"size"`
	Excl     []uint16      `json:"excluded_ports"`
	Second   float64       `json:"seconds"` // wall time of the quads
	// Phase medians (us) by side, in quad order: Medians[bench.SideA][i]
	// and Medians[bench.SideB][i] are quad i's A/B pair.
	Medians [4][]float64 `json:"medians_us"`
	// Round trips timed, by side.
	N [4]int `json:"round_trips"`
	// Counter deltas summed over the phases of each side.
	Counters [4]map[string]uint64 `json:"counters"`
	// Phases whose counters contradict their side: a B phase that paired
	// or redirected nothing, an A or A/A phase that paired or redirected
	// anything.
	Unaccelerated int `json:"b_phases_not_accelerated"`
	Accelerated   int `json:"a_phases_accelerated"`
}

// Verified says whether every phase's counters match its side.
func (p PairedB2B) Verified() bool { return p.Unaccelerated == 0 && p.Accelerated == 0 }

// AB and AA are the comparisons of the phase medians.
func (p PairedB2B) AB() bench.Paired {
	return bench.TryPaired(p.Medians[bench.SideA], p.Medians[bench.SideB], uint64(p.Quads))
}

func (p PairedB2B) AA() bench.Paired {
	return bench.TryPaired(p.Medians[bench.SideAA1], p.Medians[bench.SideAA2], uint64(p.Quads))
}

// Median of a side's phase medians (us).
func (p PairedB2B) Median(s bench.Side) float64 {
	xs := slices.Clone(p.Medians[s])
	slices.Sort(xs)
	return stats.Quantile(xs, 0.5)
}

// pairedDir holds the paired results of a results directory.
const pairedDir = "paired"

// The datapaths a paired ping-echo can take its B phases through.
const (
	PairEztunnel = "eztunnel"
	// PairNaive is the lab's naive sockmap (lab/naivesockmap): the peers'
	// model, without any of eztunnel's invariants, as a bound on what a
	// sk_msg redirect can take off this chain here.
	PairNaive = "naive"
)

// PairDatapaths lists them.
var PairDatapaths = []string{PairEztunnel, PairNaive}

// pairPath is a paired ping-echo's datapath: its counters under the names
// the phase checks read, "pairs" (connection legs paired) and
// "messages_redirected".
type pairPath interface {
	Counters() (map[string]uint64, error)
}

// naivePath gives the naive sockmap's counters those names.
type naivePath struct{ nv *naivesockmap.Naive }

func (n naivePath) Counters() (map[string]uint64, error) {
	c, err := n.nv.Counters()
	if err != nil {
		return nil, err
	}
	// Two sockets inserted per leg.
	c["pairs"], c["messages_redirected"] = c["inserted"]/2, naivesockmap.Redirected(c)
	return c, nil
}

// eztunnelPath is the agent's datapath.
type eztunnelPath struct{ dp *datapath.Datapath }

func (e eztunnelPath) Counters() (map[string]uint64, error) { return e.dp.Counters() }

// installPairPath installs o.PairDatapath for the paired ping-echo, with
// cfg's excluded ports left on the kernel path; done removes it.
func (m *meter) installPairPath(cfg datapath.Config) (_ pairPath, done func() error, err error) {
	if m.o.PairDatapath == PairNaive {
		nv, err := naivesockmap.Load(m.node.Lab.Managed, cfg.Select.ExcludePorts...)
		if err != nil {
			return nil, nil, err
		}
		return naivePath{nv}, nv.Close, nil
	}
	dp, err := datapath.Install(cfg, []string{m.node.Lab.Managed})
	if err != nil {
		return nil, nil, fmt.Errorf("install datapath: %w", err)
	}
	return eztunnelPath{dp}, func() error {
		dp.Close()
		return datapath.Uninstall(cfg, bench.Drain)
	}, nil
}

// pairedB2B runs the paired ping-echo of one mesh on a datapath installed
// for it (with cfg's selection, which must exclude meshlab.KernelPathPorts)
// and writes its result.
func (m *meter) pairedB2B(cfg datapath.Config, prog *progress) (err error) {
	o := m.o
	dp, done, err := m.installPairPath(cfg)
	if err != nil {
		return err
	}
	defer func() {
		if uerr := done(); uerr != nil && err == nil {
			err = fmt.Errorf("remove datapath %s: %w", o.PairDatapath, uerr)
		}
	}()
	cl, err := startEchoPhaser(m.ctx, m.wl, m.node.Client)
	if err != nil {
		return err
	}
	defer cl.close()
	addr := map[bench.Side]string{bench.SideA: m.node.Addr(meshlab.PortEchoKernel), bench.SideB: m.node.Addr(meshlab.PortEcho)}
	const size = 24
	// Warm-up: both paths' proxies, servers and first connections.
	for _, s := range []bench.Side{bench.SideA, bench.SideB, bench.SideA, bench.SideB} {
		if _, err := cl.phase(addr[s], o.PairPhase, o.PairConns, size); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	res := PairedB2B{Mesh: m.mesh, Datapath: o.PairDatapath, Quads: o.PairQuads, Phase: o.PairPhase, Conns: o.PairConns, Size: size,
		Excl: cfg.Select.ExcludePorts, Counters: [4]map[string]uint64{{}, {}, {}, {}}}
	prog.startPaired(fmt.Sprintf("%s paired ping-echo b2b, %d quads of %s phases", m.mesh, o.PairQuads, o.PairPhase))
	start := time.Now()
	quads, err := bench.RunQuads(o.PairQuads, bench.SideA, func(bench.Side) error { return nil }, func(s bench.Side) (workload.EchoPhase, error) {
		path := s
		if s != bench.SideB {
			path = bench.SideA // the A/A pair's phases are kernel-path phases
		}
		c0, err := dp.Counters()
		if err != nil {
			return workload.EchoPhase{}, err
		}
		ph, err := cl.phase(addr[path], o.PairPhase, o.PairConns, size)
		if err != nil {
			return ph, err
		}
		c1, err := dp.Counters()
		if err != nil {
			return ph, err
		}
		d := bench.Delta(c0, c1)
		for k, v := range d {
			res.Counters[s][k] += v
		}
		res.N[s] += ph.N
		took := d["pairs"] > 0 || d["messages_redirected"] > 0
		switch {
		case path == bench.SideB && (d["pairs"] < uint64(o.PairConns) || d["messages_redirected"] < uint64(ph.N)):
			res.Unaccelerated++
		case path == bench.SideA && took:
			res.Accelerated++
		}
		return ph, nil
	})
	if err != nil {
		return err
	}
	res.Second = time.Since(start).Seconds()
	for s, ps := range quads {
		for _, p := range ps {
			res.Medians[s] = append(res.Medians[s], p.MedianUs)
		}
	}
	if err := bench.WriteJSON(filepath.Join(o.Out, pairedDir, m.mesh+".json"), res); err != nil {
		return err
	}
	prog.done(fmt.Sprintf("A %.1f us, B %.1f us, B vs A %s, A/A %s; B phases paired %d connections, redirected %d messages; A phases %d, %d",
		res.Median(bench.SideA), res.Median(bench.SideB), res.AB().Cell(), res.AA().Cell(),
		res.Counters[bench.SideB]["pairs"], res.Counters[bench.SideB]["messages_redirected"],
		res.Counters[bench.SideA]["pairs"]+res.Counters[bench.SideAA1]["pairs"]+res.Counters[bench.SideAA2]["pairs"],
		res.Counters[bench.SideA]["messages_redirected"]+res.Counters[bench.SideAA1]["messages_redirected"]+res.Counters[bench.SideAA2]["messages_redirected"]))
	return nil
}

// LoadPaired reads the paired results of a results directory, by mesh.
func LoadPaired(dir string) (map[string]PairedB2B, error) {
	files, err := filepath.Glob(filepath.Join(dir, pairedDir, "*.json"))
	if err != nil {
		return nil, err
	}
	out := map[string]PairedB2B{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var p PairedB2B
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out[p.Mesh] = p
	}
	return out, nil
}

// echoPhaser is `workload echo-phases` running in the client pod.
type echoPhaser struct {
	in    io.WriteCloser
	out   *bufio.Reader
	errb  strings.Builder
	close func()
}

// startEchoPhaser starts the client in pod p, placed as wl says.
func startEchoPhaser(ctx context.Context, wl workload.Client, p workload.Pod) (*echoPhaser, error) {
	cctx, cancel := context.WithCancel(ctx)
	cmd := p.Cmd(cctx, wl.Exe, "workload", "echo-phases")
	ph := &echoPhaser{}
	in, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	cmd.Stderr = &ph.errb
	if err := wl.Start(p, cmd); err != nil {
		cancel()
		return nil, fmt.Errorf("workload echo-phases: %w", err)
	}
	ph.in, ph.out = in, bufio.NewReader(out)
	ph.close = func() {
		in.Close()
		bench.WaitOrKill(cmd, cancel)
	}
	return ph, nil
}

// phase asks the client for one phase.
func (ph *echoPhaser) phase(addr string, d time.Duration, conns, size int) (workload.EchoPhase, error) {
	return workload.AskPhase(ph.in, ph.out, "echo-phases", fmt.Sprintf("%s %s %d %d", addr, d, conns, size), &ph.errb)
}

// pairedLegend describes the paired rows.
func pairedLegend(p PairedB2B) string {
	return fmt.Sprintf("%d quads of %s phases (an A/A pair, both phases A, and an A/B pair; bench.QuadOrder), %d fresh connections per phase, %d B messages one at a time, the connections in turn; "+
		"A: to port %s (every leg's port excluded from the shortcut: %s), B: to port %d, the same processes and hops%s",
		p.Quads, p.Phase, p.Conns, p.Size, strconv.Itoa(meshlab.PortEchoKernel), portList(p.Excl), meshlab.PortEcho, p.naiveNote())
}

func portList(ps []uint16) string {
	var s []string
	for _, p := range ps {
		s = append(s, strconv.Itoa(int(p)))
	}
	return strings.Join(s, ", ")
}

// Naive says whether B took the naive sockmap, not eztunnel.
func (p PairedB2B) Naive() bool { return p.Datapath == PairNaive }

func (p PairedB2B) naiveNote() string {
	if !p.Naive() {
		return ""
	}
	return "; B on the lab's naive sockmap (lab/naivesockmap: no pairing proof, no read accounting, no unread bound), not eztunnel"
}

// naiveLabel marks a row whose B took the naive sockmap.
func (p PairedB2B) naiveLabel() string {
	if !p.Naive() {
		return ""
	}
	return ", B: naive sockmap"
}
