// Package scale is `eztunnel-lab bench scale`: steps of accelerated
// connections between two pods of one lab node (1k, 10k, 100k, 1M by
// default), each with a fresh agent whose maps are sized from the step.
// Connections are spread over as many server and holder processes as the
// descriptor limit requires, one server port per process pair, so neither a
// process's descriptors nor the client's ephemeral ports run out. At each
// step it measures the setup rate, a probe connection's round trips and
// CPU per message, the agent's memory, one connection listing, one metrics
// scrape and the uninstall, and checks messages on every connection before
// and after the uninstall, some of them unread while it drains. The first
// step the machine cannot hold ends the run with the resource that ended it.
package scale

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Options configures a run.
type Options struct {
	Exe   string // the eztunnel-lab binary: workloads
	Agent string // the eztunnel agent binary
	Steps []int  // connections of each step, ascending
	// Parallel is how many connections the holders open (and check) at
	// once, all together: each holder takes its part (at least one), so
	// that every step sets up with the same concurrency.
	Parallel int
	// ProbeN is the probe connection's recorded 24 B round trips, in
	// each of the probe's runs.
	ProbeN int
	// ProbeQuads is the probe's quads of runs at each step (probe.go):
	// plain TCP against the shortcut, and the shortcut against itself.
	ProbeQuads int
	// InFlight bounds the connections that carry an unread message while
	// the uninstall drains (every k-th connection of the step).
	InFlight int
	// MinAvailable ends a step whose MemAvailable falls below it.
	MinAvailable uint64
	// MinSetupRate ends a step whose connections are not all open after
	// a minute plus conns/MinSetupRate seconds.
	MinSetupRate int
	DrainTimeout time.Duration // eztunnel uninstall --drain-timeout
	// ReaderStop is how long the servers stay stopped after the uninstall
	// began, so that unread messages wait for the drain.
	ReaderStop time.Duration
	// IdleWindow is how long the agent's CPU time is taken with the
	// connections idle (its periodic work: the map fill walk and the
	// adoption scan, each every 30 s or 20 times its last CPU time, pair
	// ageing): the default, 60 s, holds a walk and a scan however they fall.
	IdleWindow time.Duration
	// MaxSockets, when set, is the least --max-sockets (and so map
	// sizing) of every step's agent: a small step then runs with the
	// maps of a large one, which tells what the maps' size costs a
	// message from what the connections held cost it.
	MaxSockets uint32
	Out        string // JSON report file; "" for none
	LabVersion string // this bench's version, for the report
	Log        io.Writer
}

// DefaultOptions are the flags' defaults.
func DefaultOptions() Options {
	return Options{Steps: []int{1000, 10000, 100000, 1000000}, Parallel: 512, ProbeN: 2000, ProbeQuads: 400, InFlight: 100000,
		MinAvailable: 3 << 30, MinSetupRate: 1000, DrainTimeout: 5 * time.Minute, ReaderStop: time.Second, IdleWindow: time.Minute}
}

// Report is the JSON report.
type Report struct {
	Date string `json:"date"`
	// Agent and Lab: the versions (with their commits) of the agent binary
	// measured and of this bench.
	Agent        string `json:"agent_version"`
	Lab          string `json:"lab_version"`
	CPUs         int    `json:"cpus"`
	CPUPlacement string `json:"cpu_placement"`
	MemTotal     uint64 `json:"mem_total_bytes"`
	Nofile       uint64 `json:"rlimit_nofile"`
	NrOpen       uint64 `json:"fs_nr_open"`
	Steps        []Row  `json:"steps"`
	// EndedBy names the resource that ended the run at EndedAt
	// connections; empty when every step ran.
	EndedBy string `json:"ended_by,omitempty"`
	EndedAt int    `json:"ended_at,omitempty"`
}

// run is one invocation: the lab and what every step shares.
type run struct {
	o      Options
	lab    *netlab.Lab
	client *netlab.Pod
	server *netlab.Pod
	wl     workload.Client
	// probeWL starts the probe's client and echo server, both on one CPU.
	probeWL workload.Client
	tmp     string
	nofile  uint64
	// probeServer, plainServer: the pids of the probe's echo servers
	// (probePort, probePlainPort).
	probeServer, plainServer int
	// gauge is the loopback pod of the probe's gauge; gaugeServer the pid
	// of its echo server (probeGaugePort).
	gauge       *netlab.Pod
	gaugeServer int
	rep         Report
}

// Run runs the steps and writes the table to stdout.
func Run(ctx context.Context, o Options, stdout io.Writer) (err error) {
	if err := o.check(); err != nil {
		return err
	}
	if err := bench.Preflight(); err != nil {
		return err
	}
	// The probe's two processes share one CPU at every step: unpinned, its
	// round trip was about 7 µs when the scheduler put both on one CPU
	// and 15 to 17 µs when it put them apart (a wake-up across CPUs),
	// from run to run at 1M, which hid any change with the step.
	probeCPU := runtime.NumCPU() - 1
	r := &run{o: o, wl: workload.Client{Exe: o.Exe},
		probeWL: workload.Client{Exe: o.Exe, Placement: workload.Placement{CPUs: []int{probeCPU}}}}
	r.rep.Date = time.Now().UTC().Format(time.RFC3339)
	r.rep.Lab = o.LabVersion
	if r.rep.Agent, err = agentVersion(ctx, o.Agent); err != nil {
		return err
	}
	r.rep.CPUs = runtime.NumCPU()
	r.rep.CPUPlacement = fmt.Sprintf("the probe's client and echo server pinned to CPU %d; the agent, every server and holder unpinned", probeCPU)
	if r.rep.NrOpen, err = bench.NrOpen(); err != nil {
		return err
	}
	// Every process the run starts inherits this limit; no process needs
	// more than a server port's share of connections.
	if r.nofile, err = bench.RaiseNofile(maxPerPort + reserveFDs); err != nil {
		return err
	}
	r.rep.Nofile = r.nofile
	fmt.Fprintf(o.Log, "RLIMIT_NOFILE %d (fs.nr_open %d): at most %d connections per process\n", r.nofile, r.rep.NrOpen, min(r.nofile-min(r.nofile, reserveFDs), maxPerPort))
	if err := r.setup(ctx); err != nil {
		return err
	}
	defer r.lab.Close()
	defer os.RemoveAll(r.tmp)
	srv, err := r.probeWL.Serve(ctx, r.server, r.tmp, "--echo", ":"+strconv.Itoa(probePort))
	if err != nil {
		return err
	}
	defer srv.Stop()
	plain, err := r.probeWL.Serve(ctx, r.server, r.tmp, "--echo", ":"+strconv.Itoa(probePlainPort))
	if err != nil {
		return err
	}
	defer plain.Stop()
	gauge, err := r.probeWL.Serve(ctx, r.gauge, r.tmp, "--echo", hostPort(r.gauge.IPv4, probeGaugePort))
	if err != nil {
		return err
	}
	defer gauge.Stop()
	r.probeServer, r.plainServer, r.gaugeServer = srv.Pid(), plain.Pid(), gauge.Pid()
	for _, n := range o.Steps {
		row, ended, err := r.step(ctx, n)
		if err != nil {
			err = fmt.Errorf("step of %d connections: %w", n, err)
			r.finish(stdout)
			return err
		}
		if ended != "" {
			r.rep.EndedBy, r.rep.EndedAt = ended, n
			fmt.Fprintf(o.Log, "step of %d connections ended: %s\n", n, ended)
			break
		}
		r.rep.Steps = append(r.rep.Steps, row)
		r.progress()
	}
	return r.finish(stdout)
}

func (o *Options) check() error {
	switch {
	case len(o.Steps) == 0:
		return errors.New("--steps: give at least one step")
	case o.Parallel < 1 || o.ProbeN < 1 || o.InFlight < 1 || o.MinSetupRate < 1:
		return errors.New("--parallel, --probe-n, --in-flight and --min-setup-rate must be at least 1")
	case o.ProbeQuads < 2:
		return errors.New("--probe-quads must be at least 2 (a paired comparison needs two pairs)")
	case o.DrainTimeout <= 0:
		return errors.New("--drain-timeout must be positive")
	case o.IdleWindow < time.Second:
		return fmt.Errorf("--idle-window %v: at least 1s", o.IdleWindow)
	}
	return nil
}

// setup builds the lab: the client and the server pod, both accelerated.
func (r *run) setup(ctx context.Context) (err error) {
	if err := netlab.Sweep(); err != nil {
		fmt.Fprintln(r.o.Log, "sweeping leftovers:", err)
	}
	if r.lab, err = netlab.New("scale", 33); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			r.lab.Close()
		}
	}()
	if r.client, err = r.lab.AddPod("c", true); err != nil {
		return err
	}
	if r.server, err = r.lab.AddPod("s", true); err != nil {
		return err
	}
	if r.gauge, err = r.lab.AddLoopbackPod("g", gaugeEhash); err != nil {
		return err
	}
	if r.tmp, err = os.MkdirTemp("", "ezscale-"); err != nil {
		return err
	}
	// Every ephemeral port for each server port; the servers' accept
	// queues as deep as the holders' connects at once.
	if err := r.client.Sysctl("net.ipv4.ip_local_port_range", "1024 65535"); err != nil {
		return err
	}
	if err := r.server.Sysctl("net.core.somaxconn", "65535"); err != nil {
		return err
	}
	if r.rep.MemTotal, err = memTotal(); err != nil {
		return err
	}
	return r.conntrackRoom(r.o.Steps[len(r.o.Steps)-1])
}

// conntrackRoom: bridged pod traffic passes the host's conntrack where
// br_netfilter calls iptables; a table smaller than the largest step would
// drop its handshakes. It raises nf_conntrack_max for the run, recorded so
// that the old value comes back even if this process is killed.
func (r *run) conntrackRoom(conns int) error {
	const maxPath = "/proc/sys/net/netfilter/nf_conntrack_max"
	old, err := readUint(maxPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil // no conntrack on this machine
	}
	if err != nil {
		return err
	}
	count, err := readUint("/proc/sys/net/netfilter/nf_conntrack_count")
	if err != nil {
		return err
	}
	want := count + uint64(conns)*11/10 + 10000
	if old >= want {
		return nil
	}
	if _, err := r.lab.Record(netlab.RecSysctl, maxPath, strconv.FormatUint(old, 10)); err != nil {
		return err
	}
	if err := os.WriteFile(maxPath, []byte(strconv.FormatUint(want, 10)), 0o644); err != nil {
		return fmt.Errorf("raise net.netfilter.nf_conntrack_max to %d: %w", want, err)
	}
	fmt.Fprintf(r.o.Log, "net.netfilter.nf_conntrack_max raised from %d to %d for the run (bridged handshakes are tracked)\n", old, want)
	return nil
}

func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

func memTotal() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("/proc/meminfo has no MemTotal")
}

// finish prints the table and writes the JSON report.
func (r *run) finish(stdout io.Writer) error {
	fmt.Fprint(stdout, Table(r.rep))
	if r.o.Out != "" {
		return bench.WriteJSON(r.o.Out, r.rep)
	}
	return nil
}

// progress logs the table so far after each step.
func (r *run) progress() {
	fmt.Fprint(r.o.Log, Table(Report{Steps: r.rep.Steps}))
}

func hostPort(ip fmt.Stringer, port int) string {
	return net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// gaugeEhash: the gauge pod's TCP hash buckets (it holds two sockets at a
// time).
const gaugeEhash = 1024

// agentVersion is `agent version -o json`'s version and commit.
func agentVersion(ctx context.Context, agent string) (string, error) {
	out, err := sysexec.Command(ctx, agent, "version", "-o", "json").Output()
	if err != nil {
		return "", fmt.Errorf("%s version: %w", agent, err)
	}
	var v struct{ Version, Commit string }
	if err := json.Unmarshal(out, &v); err != nil {
		return "", fmt.Errorf("%s version -o json: %w", agent, err)
	}
	if v.Commit != "" && !strings.HasPrefix(v.Commit, v.Version) {
		return v.Version + " (" + v.Commit + ")", nil
	}
	return cmp.Or(v.Commit, v.Version), nil
}
