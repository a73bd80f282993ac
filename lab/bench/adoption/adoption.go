// Package adoption measures what adopting a connection established before
// the agent gives: its round-trip time before adoption (plain TCP), after
// adoption, and that of a connection paired at its handshake, in
// interleaved rounds on one lab node (`eztunnel-lab bench adopt`).
package adoption

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Options configures the benchmark.
type Options struct {
	Rounds int
	Conns  int    // connections per pool
	N      int    // round trips per connection and phase
	Mesh   string // meshlab mode: none, sidecar or ambient (legs per connection: 1, 3, 3)
	Exe    string
	Log    io.Writer
}

// Round is one round's medians (µs) and the rounds the adoption needed.
type Round struct {
	Before      stats.Summary `json:"before"`    // the pool, before the datapath existed
	Adopted     stats.Summary `json:"adopted"`   // the same connections after adoption
	Handshake   stats.Summary `json:"handshake"` // a new pool, paired at its handshakes
	AdoptRounds int           `json:"adopt_rounds"`
}

// Run runs o.Rounds rounds and prints a table of p50/p99 and ratios.
func Run(ctx context.Context, o Options, stdout io.Writer) (err error) {
	if o.Rounds < 1 || o.Conns < 1 || o.N < 1 {
		return fmt.Errorf("--rounds, --conns and --n must be at least 1")
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := bench.Preflight(); err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	mesh, err := meshlab.ParseMesh(o.Mesh)
	if err != nil {
		return err
	}
	if mesh.TLS {
		return fmt.Errorf("--mesh %s: TLS legs are not node-local TCP the shortcut pairs end to end", o.Mesh)
	}
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = "/sys/fs/bpf/ezbench-adopt"
	if err := bench.Sweep(cfg, o.Log); err != nil {
		return fmt.Errorf("remove leftovers of an earlier run: %w", err)
	}
	cpu := runtime.NumCPU() - 1
	placement := workload.Placement{CPUs: []int{cpu}}
	node, err := meshlab.New(ctx, meshlab.Config{Name: "adopt", Subnet: 36, Mesh: mesh, Exe: o.Exe, Placement: placement, Log: o.Log})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, node.Close()) }()
	wl := workload.Client{Exe: o.Exe, Placement: placement}
	addr := node.Addr(meshlab.PortPool)
	legs := 1
	if mesh.Kind != "none" {
		legs = 3 // app -> proxy -> proxy -> app
	}
	a, lab := node.Client, node.Lab
	var rounds []Round
	for i := range o.Rounds {
		r, err := round(ctx, o, cfg, lab, wl, a, addr, legs)
		if err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		fmt.Fprintf(o.Log, "round %d: p50 before %.1f µs, adopted %.1f µs, handshake %.1f µs (%d adoption rounds)\n",
			i, r.Before.P50, r.Adopted.P50, r.Handshake.P50, r.AdoptRounds)
		rounds = append(rounds, r)
	}
	return report(stdout, o, cpu, rounds)
}

// pingClient is one pool-ping process.
type pingClient struct {
	dir     string
	done    chan error
	exited  bool
	exitErr error
	out     strings.Builder
}

func startPing(ctx context.Context, wl workload.Client, p *netlab.Pod, addr string, o Options, phases int) (*pingClient, error) {
	dir, err := os.MkdirTemp("", "ezbench-adopt-")
	if err != nil {
		return nil, err
	}
	c := &pingClient{dir: dir, done: make(chan error, 1)}
	cmd := p.Cmd(ctx, o.Exe, "workload", "pool-ping", "--addr", addr, "--conns", strconv.Itoa(o.Conns),
		"--n", strconv.Itoa(o.N), "--phases", strconv.Itoa(phases), "--dir", dir)
	cmd.Stdout, cmd.Stderr = &c.out, o.Log
	if err := wl.Start(p, cmd); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() { c.done <- cmd.Wait() }()
	return c, nil
}

// phase lets phase p run and waits for it.
func (c *pingClient) phase(ctx context.Context, p int) error {
	if err := os.WriteFile(filepath.Join(c.dir, fmt.Sprintf("go-%d", p)), nil, 0o644); err != nil {
		return err
	}
	done := filepath.Join(c.dir, fmt.Sprintf("done-%d", p))
	for {
		if _, err := os.Stat(done); err == nil {
			return nil
		}
		if c.exited {
			return fmt.Errorf("pool-ping exited in phase %d: %v", p, c.exitErr)
		}
		select {
		case c.exitErr = <-c.done:
			c.exited = true
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (c *pingClient) result() (*workload.PoolPingResult, error) {
	defer os.RemoveAll(c.dir)
	if !c.exited {
		c.exitErr, c.exited = <-c.done, true
	}
	if c.exitErr != nil {
		return nil, fmt.Errorf("pool-ping: %w", c.exitErr)
	}
	var res workload.PoolPingResult
	if err := json.Unmarshal([]byte(c.out.String()), &res); err != nil {
		return nil, fmt.Errorf("pool-ping output: %w", err)
	}
	return &res, nil
}

func round(ctx context.Context, o Options, cfg datapath.Config, lab *netlab.Lab, wl workload.Client, a *netlab.Pod, addr string, legs int) (r Round, err error) {
	old, err := startPing(ctx, wl, a, addr, o, 2)
	if err != nil {
		return r, err
	}
	if err := old.phase(ctx, 0); err != nil {
		return r, err
	}
	dp, err := datapath.Install(cfg, []string{lab.Managed})
	if err != nil {
		return r, fmt.Errorf("install datapath: %w", err)
	}
	defer func() {
		dp.Close()
		err = errors.Join(err, datapath.Uninstall(cfg, bench.Drain))
	}()
	before, err := dp.Counters()
	if err != nil {
		return r, err
	}
	// Idle between phases; a round may still see a delayed ACK.
	for r.AdoptRounds < 50 {
		r.AdoptRounds++
		if _, err := dp.Adopt([]string{lab.Managed}); err != nil {
			return r, err
		}
		c, err := dp.Counters()
		if err != nil {
			return r, err
		}
		if c["adopted"]-before["adopted"] >= uint64(legs*o.Conns) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := old.phase(ctx, 1); err != nil {
		return r, err
	}
	fresh, err := startPing(ctx, wl, a, addr, o, 1)
	if err != nil {
		return r, err
	}
	if err := fresh.phase(ctx, 0); err != nil {
		return r, err
	}
	after, err := dp.Counters()
	if err != nil {
		return r, err
	}
	d := bench.Delta(before, after)
	if d["adopted"] != uint64(legs*o.Conns) || d["pairs"] != uint64(2*legs*o.Conns) {
		return r, fmt.Errorf("adopted %d and paired %d in all, want %d and %d: %v", d["adopted"], d["pairs"], legs*o.Conns, 2*legs*o.Conns, d)
	}
	ro, err := old.result()
	if err != nil {
		return r, err
	}
	rf, err := fresh.result()
	if err != nil {
		return r, err
	}
	r.Before, r.Adopted, r.Handshake = stats.Summarize(ro.Phases[0]), stats.Summarize(ro.Phases[1]), stats.Summarize(rf.Phases[0])
	return r, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return stats.Quantile(s, 0.5)
}

func report(w io.Writer, o Options, cpu int, rounds []Round) error {
	col := func(f func(Round) float64) []float64 {
		var out []float64
		for _, r := range rounds {
			out = append(out, f(r))
		}
		return out
	}
	span := func(xs []float64, digits int) string {
		return fmt.Sprintf("%s (%s–%s)", bench.Num(median(xs), digits), bench.Num(slices.Min(xs), digits), bench.Num(slices.Max(xs), digits))
	}
	rows := [][]string{
		{"p50 RTT (µs)", span(col(func(r Round) float64 { return r.Before.P50 }), 1), span(col(func(r Round) float64 { return r.Adopted.P50 }), 1),
			span(col(func(r Round) float64 { return r.Handshake.P50 }), 1),
			span(col(func(r Round) float64 { return r.Adopted.P50 / r.Handshake.P50 }), 3),
			span(col(func(r Round) float64 { return r.Adopted.P50 / r.Before.P50 }), 3)},
		{"p99 RTT (µs)", span(col(func(r Round) float64 { return r.Before.P99 }), 1), span(col(func(r Round) float64 { return r.Adopted.P99 }), 1),
			span(col(func(r Round) float64 { return r.Handshake.P99 }), 1),
			span(col(func(r Round) float64 { return r.Adopted.P99 / r.Handshake.P99 }), 3),
			span(col(func(r Round) float64 { return r.Adopted.P99 / r.Before.P99 }), 3)},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nadoption, mesh %s: %d connections (Go netpoller, 24 B ping-pong, %d round trips each per phase), every process pinned to CPU %d; %d interleaved rounds, median (min–max)\n\n",
		o.Mesh, o.Conns, o.N, cpu, len(rounds))
	bench.WriteTable(&sb, []string{"", "before adoption (kernel)", "adopted", "paired at handshake", "adopted / handshake", "adopted / before"}, rows)
	_, err := io.WriteString(w, sb.String())
	return err
}
