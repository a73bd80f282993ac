// Package hops is bench hops: where each hop's time goes on a mesh chain
// (sidecar: app -> outbound HAProxy under OUTPUT REDIRECT -> inbound HAProxy
// under PREROUTING REDIRECT -> server; ambient: app -> node proxy ->
// server), with plain TCP, the lab's naive sockmap (lab/naivesockmap: the
// peers' model) and eztunnel, interleaved on one node pinned to one CPU.
// Per datapath the 24 B back-to-back ping-echo p50; per program its runs and
// time per round trip (BPF run-time statistics); and the gap eztunnel -
// naive split by program plus the time in no program.
package hops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// The datapaths compared.
const (
	Plain    = "plain"
	Naive    = "naive"
	Eztunnel = "eztunnel"
)

// Datapaths in their first round's order.
var Datapaths = []string{Plain, Naive, Eztunnel}

// Options of a run.
type Options struct {
	Meshes  []string
	Rounds  int // rounds of one run per datapath, order rotated each round
	PingN   int // recorded round trips per run (and per statistics run)
	CPU     int // every lab process pinned to it
	Nice    int
	LabName string
	Subnet  int
	PinRoot string
	JSON    string // also write the result here
	Exe     string
	Log     io.Writer
}

// DefaultOptions: sidecar and ambient, 5 rounds of 3,000 round trips, the
// last CPU, nice -10 (as bench lab --quick).
func DefaultOptions() Options {
	return Options{Meshes: []string{"sidecar", "ambient"}, Rounds: 5, PingN: 3000, CPU: runtime.NumCPU() - 1,
		Nice: -10, LabName: "hops", Subnet: 41, PinRoot: "/sys/fs/bpf/ezbench-hops"}
}

// Run is one datapath's run in one round.
type Run struct {
	Mesh     string `json:"mesh"`
	Datapath string `json:"datapath"`
	Round    int    `json:"round"`
	// P50 of the timed run (statistics off), in µs.
	P50 float64 `json:"p50_us"`
	// RoundTrips of the statistics run (warm-up included), and each
	// program's runs and time over it.
	RoundTrips int                       `json:"round_trips"`
	Progs      map[string]bench.ProgStat `json:"progs,omitempty"`
	// Counters of the datapath over both runs (naive: its own; eztunnel:
	// the shortcut's).
	Counters map[string]uint64 `json:"counters,omitempty"`
}

// Result of a bench hops run.
type Result struct {
	Runs []Run `json:"runs"`
}

// warmup round trips of each run, before the recorded ones.
const warmup = 50

// Bench runs every mesh and prints the report.
func Bench(ctx context.Context, o Options, stdout io.Writer) (err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Rounds < 1 || o.PingN < 1 || len(o.Meshes) == 0 {
		return errors.New("need at least one mesh, one round and one round trip")
	}
	if err := bench.Preflight(); err != nil {
		return err
	}
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = o.PinRoot
	if err := bench.Sweep(cfg, o.Log); err != nil {
		return fmt.Errorf("remove leftovers of an earlier run: %w", err)
	}
	defer func() {
		if _, serr := os.Stat(cfg.Dir()); serr == nil {
			err = errors.Join(err, datapath.Uninstall(cfg, bench.Drain))
		}
	}()
	var res Result
	for _, name := range o.Meshes {
		mesh, err := meshlab.ParseMesh(name)
		if err != nil {
			return err
		}
		runs, err := benchMesh(ctx, o, cfg, mesh)
		if err != nil {
			return fmt.Errorf("mesh %s: %w", mesh, err)
		}
		res.Runs = append(res.Runs, runs...)
	}
	if o.JSON != "" {
		if err := bench.WriteJSON(o.JSON, res); err != nil {
			return err
		}
	}
	_, err = io.WriteString(stdout, Report(res))
	return err
}

// benchMesh builds a node of mesh and runs the rounds on it.
func benchMesh(ctx context.Context, o Options, cfg datapath.Config, mesh meshlab.Mesh) (_ []Run, err error) {
	place := workload.Placement{CPUs: []int{o.CPU}, Nice: o.Nice}
	fmt.Fprintf(o.Log, "mesh %s: building the node\n", mesh)
	n, err := meshlab.New(ctx, meshlab.Config{Name: o.LabName, Subnet: o.Subnet, Mesh: mesh, Exe: o.Exe, Placement: place, Log: o.Log})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := n.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("remove node: %w", cerr))
		}
	}()
	h := &hop{ctx: ctx, o: o, cfg: cfg, node: n, mesh: mesh.String(), wl: workload.Client{Exe: o.Exe, Placement: place}}
	if _, err := h.ping(); err != nil { // warm-up: caches, ARP, the proxies' first connections
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var runs []Run
	for round := 1; round <= o.Rounds; round++ {
		order := slices.Clone(Datapaths)
		k := (round - 1) % len(order)
		order = append(order[k:], order[:k]...)
		for _, dp := range order {
			r, err := h.run(dp)
			if err != nil {
				return nil, fmt.Errorf("round %d %s: %w", round, dp, err)
			}
			r.Round = round
			fmt.Fprintf(o.Log, "mesh %s round %d %s: p50 %.1f µs\n", mesh, round, dp, r.P50)
			runs = append(runs, r)
		}
	}
	return runs, nil
}

// hop measures datapaths on one node.
type hop struct {
	ctx  context.Context
	o    Options
	cfg  datapath.Config
	node *meshlab.Node
	mesh string
	wl   workload.Client
}

// ping runs one ping-echo client: PingN recorded 24 B round trips on one
// connection through the chain; the p50 in µs.
func (h *hop) ping() (float64, error) {
	pp := workload.PingPongArgs{Addr: h.node.Addr(meshlab.PortEcho), Size: 24, N: h.o.PingN, Warmup: warmup, Conns: 1}
	out, _, err := h.wl.PingPong(h.ctx, h.node.Client, pp)
	if err != nil {
		return 0, err
	}
	return out.Micros.P50, nil
}
