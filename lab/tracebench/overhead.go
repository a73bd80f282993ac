// Package tracebench measures what `eztunnel trace` costs: nanoseconds per
// probe from the kernel's BPF run-time statistics, and pod-to-pod RTT and
// throughput without and with the tracer attached, on a throwaway lab node.
package tracebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/tracer"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Lab of the overhead run; the trace tests use "trc"/"trc2" (40, 41).
const (
	labName   = "trov"
	labSubnet = 42
)

// Options of Overhead.
type Options struct {
	Exe   string    // eztunnel binary run inside the pods
	RTTN  int       // recorded 24 B round trips
	Bytes uint64    // bytes of the throughput transfer
	Log   io.Writer // progress
}

// Traffic is one measurement of the lab's pod-to-pod path.
type Traffic struct {
	RTTP50us float64 `json:"rtt_p50_us"`
	RTTP99us float64 `json:"rtt_p99_us"`
	Gbps     float64 `json:"gbps"`
}

// ProbeCost is one program's run-time statistics while traced.
type ProbeCost struct {
	Program string  `json:"program"`
	Runs    uint64  `json:"runs"`
	NsPer   float64 `json:"ns_per_run"`
}

// Result of Overhead.
type Result struct {
	Baseline Traffic         `json:"baseline"`
	Traced   Traffic         `json:"traced"`
	Probes   []ProbeCost     `json:"probes"`
	NsPer    float64         `json:"ns_per_probe"` // all runs of all programs
	Packets  int             `json:"packets"`
	Counters tracer.Counters `json:"counters"`
}

// Overhead measures the lab without the tracer, then with it (every packet
// of the lab selected), with BPF run-time statistics enabled only for the
// traced run; the statistics switch is released (restored) on return.
func Overhead(ctx context.Context, o Options, out io.Writer) (err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	lab, err := netlab.New(labName, labSubnet)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, lab.Close()) }()
	a, err := lab.AddPod("a", false)
	if err != nil {
		return err
	}
	b, err := lab.AddPod("b", false)
	if err != nil {
		return err
	}
	wl := workload.Client{Exe: o.Exe}
	srv, err := wl.Serve(ctx, b, "", "--stream", ":7000", "--echo", ":7001")
	if err != nil {
		return err
	}
	defer srv.Stop()
	var res Result
	fmt.Fprintln(o.Log, "baseline: no tracer")
	if res.Baseline, err = measure(ctx, o, wl, a, b); err != nil {
		return err
	}

	statsOn, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	defer statsOn.Close()
	cfg := tracer.DefaultConfig()
	cfg.Filter.Host = b.IPv4
	cfg.NetNS = []string{"", a.NetNS, b.NetNS}
	cfg.Interfaces = []tracer.Iface{{NetNS: a.NetNS, Name: "eth0"}, {NetNS: b.NetNS, Name: "eth0"}}
	t, err := tracer.Open(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	tctx, tstop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runErr = t.Run(tctx, func(tracer.Record) { res.Packets++ })
	}()
	fmt.Fprintf(o.Log, "traced: %d programs attached\n", len(t.Attached))
	res.Traced, err = measure(ctx, o, wl, a, b)
	tstop()
	wg.Wait()
	if err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	if res.Counters, err = t.Counters(); err != nil {
		return err
	}
	if err := probeCosts(t, &res); err != nil {
		return err
	}
	return write(out, res)
}

func probeCosts(t *tracer.Tracer, res *Result) error {
	seen := map[*ebpf.Program]bool{}
	var runs uint64
	var total time.Duration
	for _, a := range t.Attached {
		if seen[a.Program] {
			continue
		}
		seen[a.Program] = true
		s, err := a.Program.Stats()
		if err != nil {
			return fmt.Errorf("program stats: %w", err)
		}
		info, _ := a.Program.Info()
		name := a.Where
		if info != nil {
			name = info.Name
		}
		if s.RunCount == 0 {
			continue
		}
		runs += s.RunCount
		total += s.Runtime
		res.Probes = append(res.Probes, ProbeCost{Program: name, Runs: s.RunCount, NsPer: float64(s.Runtime.Nanoseconds()) / float64(s.RunCount)})
	}
	sort.Slice(res.Probes, func(i, j int) bool { return res.Probes[i].Runs > res.Probes[j].Runs })
	if runs > 0 {
		res.NsPer = float64(total.Nanoseconds()) / float64(runs)
	}
	return nil
}

func write(w io.Writer, r Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "program\truns\tns/run\t\n")
	for _, p := range r.Probes {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t\n", p.Program, p.Runs, p.NsPer)
	}
	fmt.Fprintf(tw, "all probes\t\t%.0f\t\n", r.NsPer)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\npackets traced %d, lost %d, evicted %d\n", r.Packets, r.Counters.Lost(), r.Counters.Evicted)
	fmt.Fprintf(w, "RTT 24 B p50: %.1f us -> %.1f us (%+.1f%%); p99: %.1f -> %.1f us\n",
		r.Baseline.RTTP50us, r.Traced.RTTP50us, pct(r.Baseline.RTTP50us, r.Traced.RTTP50us), r.Baseline.RTTP99us, r.Traced.RTTP99us)
	fmt.Fprintf(w, "throughput: %.2f Gbit/s -> %.2f Gbit/s (%+.1f%%)\n", r.Baseline.Gbps, r.Traced.Gbps, pct(r.Baseline.Gbps, r.Traced.Gbps))
	return json.NewEncoder(os.Stderr).Encode(r)
}

func pct(a, b float64) float64 { return (b - a) / a * 100 }

func measure(ctx context.Context, o Options, wl workload.Client, a, b *netlab.Pod) (Traffic, error) {
	var tr Traffic
	host := b.IPv4.String()
	pp, _, err := wl.PingPong(ctx, a, workload.PingPongArgs{Addr: net.JoinHostPort(host, "7001"), Size: 24, N: o.RTTN, Warmup: 500})
	if err != nil {
		return tr, err
	}
	tr.RTTP50us, tr.RTTP99us = pp.Micros.P50, pp.Micros.P99
	secs, _, err := wl.Upload(ctx, a, net.JoinHostPort(host, "7000"), o.Bytes, 65536)
	if err != nil {
		return tr, err
	}
	tr.Gbps = float64(o.Bytes) * 8 / secs / 1e9
	fmt.Fprintf(o.Log, "  RTT p50 %.1f us, %.2f Gbit/s\n", tr.RTTP50us, tr.Gbps)
	return tr, nil
}
