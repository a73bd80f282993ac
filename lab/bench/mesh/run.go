package mesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/workload"
	"github.com/prometheus/procfs"
)

// Bench runs the benchmark lab: for each mesh mode a fresh node, a warm-up
// pass, the paired ping-echo (o.PairQuads, paired.go), then o.Reps rounds of four runs of every workload (roundModes: an
// A/A pair of baseline runs and an A/B pair of baseline and eztunnel). Raw
// results go to o.Out/raw as they are measured; at the end summary.md,
// runs.csv and the plots are rendered from them and the main table is
// printed to stdout. Everything it creates is removed on return, also on
// error and when ctx is cancelled (Ctrl-C).
func Bench(ctx context.Context, o Options, stdout io.Writer) (err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := o.validate(); err != nil {
		return err
	}
	if err := bench.Preflight(); err != nil {
		return err
	}
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = o.PinRoot
	// The paired ping-echo's kernel path; no other workload uses these ports.
	cfg.Select.ExcludePorts = meshlab.KernelPathPorts
	if err := bench.Sweep(cfg, o.Log); err != nil {
		return fmt.Errorf("remove leftovers of an earlier run: %w", err)
	}
	defer func() {
		// Normally uninstalled after each eztunnel run; this covers errors.
		if _, serr := os.Stat(cfg.Dir()); serr == nil {
			if uerr := datapath.Uninstall(cfg, bench.Drain); uerr != nil {
				err = errors.Join(err, fmt.Errorf("cleanup: %w", uerr))
			}
		}
	}()
	if err := os.MkdirAll(filepath.Join(o.Out, "raw"), 0o755); err != nil {
		return err
	}
	facts := collectFacts(o)
	if err := bench.WriteJSON(filepath.Join(o.Out, "machine.json"), facts); err != nil {
		return err
	}
	runs, paired := len(o.Meshes)*o.Reps*4*len(o.Workloads), 0
	if o.PairQuads > 0 {
		paired = len(o.Meshes)
	}
	prog := newProgress(o.Log, runs+paired, paired)
	for _, name := range o.Meshes {
		mesh, _ := meshlab.ParseMesh(name)
		if err := benchMesh(ctx, o, cfg, mesh, prog); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted: %w", ctx.Err())
			}
			return fmt.Errorf("mesh %s: %w", mesh, err)
		}
	}
	fmt.Fprintf(o.Log, "measurements took %s; rendering the report\n", prog.elapsed())
	rep, err := RenderReport(o.Out)
	if err != nil {
		return err
	}
	if err := rep.WriteMain(stdout); err != nil {
		return err
	}
	fmt.Fprintf(o.Log, "results in %s (summary.md, runs.csv, raw/, plots/)\n", o.Out)
	if !rep.Verified {
		return errors.New("some eztunnel run paired no connection; its numbers are not accelerated")
	}
	return nil
}

// labMesh builds one node and runs every repetition on it.
func benchMesh(ctx context.Context, o Options, cfg datapath.Config, mesh meshlab.Mesh, prog *progress) (err error) {
	prog.note("mesh %s: building the node", mesh)
	cpus, err := workload.ParseCPUs(o.CPUs)
	if err != nil {
		return err
	}
	place := workload.Placement{CPUs: cpus, Nice: o.Nice}
	n, err := meshlab.New(ctx, meshlab.Config{Name: o.LabName, Subnet: o.Subnet, Mesh: mesh, Exe: o.Exe, Placement: place, Log: o.Log})
	if err != nil {
		return err
	}
	pfs, err := procfs.NewDefaultFS()
	if err != nil {
		return err
	}
	defer func() {
		if cerr := n.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("remove node: %w", cerr))
		}
	}()
	m := &meter{ctx: ctx, o: o, node: n, mesh: mesh.String(), fs: pfs,
		wl: workload.Client{Exe: o.Exe, Placement: place}}
	prog.note("mesh %s: warm-up", mesh)
	for _, w := range o.Workloads {
		if w == WPaced {
			continue
		}
		if _, err := m.run(w, warmupScale, nil); err != nil {
			return fmt.Errorf("warm-up %s: %w", w, err)
		}
	}
	if o.PairQuads > 0 {
		if err := m.pairedB2B(cfg, prog); err != nil {
			return fmt.Errorf("paired ping-echo: %w", err)
		}
	}
	for rep := 1; rep <= o.Reps && len(o.Workloads) > 0; rep++ {
		for _, mode := range roundModes(rep) {
			if err := m.mode(cfg, mode, rep, prog); err != nil {
				return err
			}
		}
	}
	return nil
}

// mode runs every workload once in one mode, installing the datapath for
// the eztunnel mode and uninstalling it afterwards.
func (m *meter) mode(cfg datapath.Config, mode string, rep int, prog *progress) error {
	var dp *datapath.Datapath
	if mode == ModeEztunnel {
		var err error
		if dp, err = datapath.Install(cfg, []string{m.node.Lab.Managed}); err != nil {
			return fmt.Errorf("install datapath: %w", err)
		}
	}
	var err error
	for _, w := range m.o.Workloads {
		prog.start(fmt.Sprintf("%s r%d %s %s", m.mesh, rep, mode, w))
		var r Run
		if r, err = m.run(w, m.o.scale(), dp); err != nil {
			err = fmt.Errorf("%s rep %d %s: %w", mode, rep, w, err)
			break
		}
		r.Mode, r.Rep = mode, rep
		path := filepath.Join(m.o.Out, "raw", fmt.Sprintf("%s_%s_r%d_%s.json", r.Mesh, mode, rep, w))
		if err = bench.WriteJSON(path, r); err != nil {
			break
		}
		prog.done(headline(r))
	}
	if dp != nil {
		dp.Close()
		if uerr := datapath.Uninstall(cfg, bench.Drain); uerr != nil {
			err = errors.Join(err, fmt.Errorf("uninstall datapath: %w", uerr))
		}
	}
	return err
}

// meter runs workloads on a node and measures what they cost.
type meter struct {
	ctx  context.Context
	o    Options
	node *meshlab.Node
	mesh string
	fs   procfs.FS
	wl   workload.Client // clients run in the client pod, pinned like the node
}

// run measures one workload: its own metrics, system-wide and per-process
// CPU seconds, memory, and with dp the datapath's counters and map memory.
func (m *meter) run(w string, s scale, dp *datapath.Datapath) (Run, error) {
	r := Run{Mesh: m.mesh, Workload: w}
	var before datapath.Counters
	if dp != nil {
		var err error
		if before, err = dp.Counters(); err != nil {
			return r, err
		}
	}
	procs0 := procTimes(m.fs, m.node.Lab.Managed)
	busy0, err := bench.SystemBusy(m.fs)
	if err != nil {
		return r, err
	}
	stopPeak, err := bench.SockMemPeak(m.fs)
	if err != nil {
		return r, err
	}
	res, err := workloadFuncs[w](m, s, &r)
	r.SockMem = float64(stopPeak()) / (1 << 20) // MiB
	if err != nil {
		return r, err
	}
	busy1, err := bench.SystemBusy(m.fs)
	if err != nil {
		return r, err
	}
	r.CPU = busy1 - busy0
	r.ProcCPU = procDelta(procs0, procTimes(m.fs, m.node.Lab.Managed))
	r.ProcCPU[res.name] += res.CPU
	r.Seconds = res.Seconds
	if r.MemUsed, err = memUsedMB(m.fs); err != nil {
		return r, err
	}
	if dp != nil {
		after, err := dp.Counters()
		if err != nil {
			return r, err
		}
		r.Counters = bench.Delta(before, after)
		// The datapath is loaded in this process: its fds are the BPF
		// objects the lab holds.
		mem, err := bench.ProcessBPFMemory(os.Getpid())
		if err != nil {
			return r, err
		}
		r.BPFMaps, r.BPFProgs = float64(mem.Maps)/(1<<20), float64(mem.Programs)/(1<<20)
	}
	return r, nil
}

// headline is the one-line result of a run for the progress display.
func headline(r Run) string {
	var s string
	switch r.Workload {
	case WPaced, WB2B:
		s = fmt.Sprintf("p50 %.1f us, p99 %.1f us", r.Latency.P50, r.Latency.P99)
	case WTransfer:
		s = fmt.Sprintf("FCT %.2f s", r.FCT)
	case WRedis:
		s = fmt.Sprintf("%.0f ops/s, p50 %.0f us", r.Rate, r.Latency.P50)
	case WHTTP:
		s = fmt.Sprintf("%.0f req/s, p50 %.0f us", r.Rate, r.Latency.P50)
	}
	s += fmt.Sprintf(", CPU %.2f s", r.CPU)
	if r.Counters != nil {
		s += fmt.Sprintf(", pairs %d", r.Counters["pairs"])
	}
	return s
}

// progress prints one line per finished run with completion and ETA. The
// paired ping-echo steps (one per mesh) take far longer than a run: the
// ETA adds the mean duration of each kind times the steps of it left.
type progress struct {
	w      io.Writer
	total  int // runs and paired steps
	paired int // of total, paired steps
	n      int
	begin  time.Time
	label  string
	runBeg time.Time
	isPair bool
	// Durations and counts of the finished runs and paired steps.
	runSum, pairSum time.Duration
	runs, pairs     int
}

func newProgress(w io.Writer, total, paired int) *progress {
	return &progress{w: w, total: total, paired: paired, begin: time.Now()}
}

func (p *progress) elapsed() time.Duration { return time.Since(p.begin).Round(time.Second) }

func (p *progress) note(format string, args ...any) {
	fmt.Fprintf(p.w, "[%s] %s\n", p.elapsed(), fmt.Sprintf(format, args...))
}

func (p *progress) start(label string) { p.label, p.runBeg, p.isPair = label, time.Now(), false }

// startPaired starts a paired ping-echo step.
func (p *progress) startPaired(label string) { p.start(label); p.isPair = true }

func (p *progress) done(result string) {
	p.n++
	took := time.Since(p.runBeg)
	if p.isPair {
		p.pairSum += took
		p.pairs++
	} else {
		p.runSum += took
		p.runs++
	}
	eta, known := time.Duration(0), true
	for _, k := range []struct {
		sum        time.Duration
		done, left int
	}{{p.runSum, p.runs, p.total - p.paired - p.runs}, {p.pairSum, p.pairs, p.paired - p.pairs}} {
		switch {
		case k.left == 0:
		case k.done == 0:
			known = false
		default:
			eta += k.sum / time.Duration(k.done) * time.Duration(k.left)
		}
	}
	etas := "?"
	if known {
		etas = eta.Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "[%3d/%d %3.0f%% ETA %s] %s: %s (%.1fs)\n", p.n, p.total,
		100*float64(p.n)/float64(p.total), etas, p.label, result, took.Seconds())
}
