// Package tracepaths is `eztunnel-lab bench trace-paths`: the lattrace
// thesis' CNI comparison (time spent per direction and per network
// namespace, median and PDV) made with eztunnel's packet-path tracer, for
// the three datapaths of the multi-node lab (the bridge and the node's
// iptables, the tc bypass, the bypass with the socket shortcut), same-node
// and cross-node, request/response over TCP and UDP. The datapaths run in
// interleaved rounds (order rotated each round); every workload run is
// traced by a tracer of its own that sees both nodes as hosts and does not
// trace the underlay switch (the wire). docs/tracing.md has a run.
package tracepaths

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/tracer"
	"github.com/eztunnel/eztunnel/lab/bench/bypass"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

const bridgeName = bypass.Bridge

// Options configure a run.
type Options struct {
	Agent     string   // the eztunnel binary
	Lab       string   // the eztunnel-lab binary (workloads)
	Rounds    int      // interleaved rounds of the three datapaths
	N         int      // request/response exchanges per run
	Size      int      // bytes of each request and response
	Protos    []string // "tcp", "udp"
	NF        bool     // also time the nodes' netfilter tables (more probes on the kernel path)
	ClientCPU int      // CPU of the client; -1: any
	ServerCPU int      // CPU of the servers; -1: any
	CSVDir    string   // when set, every run's records go to DIR/<round>-<datapath>-<pair>-<proto>.csv
}

// port of the TCP and UDP echo servers in each server pod.
const port = 7000

// Run builds a two-node host-gw lab, runs the rounds and writes the tables.
func Run(ctx context.Context, o Options, w io.Writer) (err error) {
	if o.Rounds < 1 || o.N < 100 || o.Size < 1 {
		return fmt.Errorf("bench trace-paths: rounds %d (>= 1), n %d (>= 100), size %d (>= 1)", o.Rounds, o.N, o.Size)
	}
	for _, p := range o.Protos {
		if p != "tcp" && p != "udp" {
			return fmt.Errorf("bench trace-paths: protocol %q: want tcp or udp", p)
		}
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	l, err := bypass.NewLab("btp", multinode.HostGW, bypass.PinPrefix)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	n1, n2 := l.Node(1), l.Node(2)
	client, err := n1.AddPod("c", true)
	if err != nil {
		return err
	}
	local, err := n1.AddPod("s", true)
	if err != nil {
		return err
	}
	remote, err := n2.AddPod("r", true)
	if err != nil {
		return err
	}
	servers := map[string]*multinode.Pod{SameNode: local, CrossNode: remote}
	tmp, err := os.MkdirTemp("", "eztunnel-bench-trace-paths-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	srvWL := workload.Client{Exe: o.Lab, Placement: placement(o.ServerCPU)}
	cliWL := workload.Client{Exe: o.Lab, Placement: placement(o.ClientCPU)}
	for _, p := range []*multinode.Pod{local, remote} {
		stop, err := startServers(ctx, srvWL, p, tmp, o)
		if err != nil {
			return err
		}
		defer stop()
	}
	datapaths := bypass.Datapaths()
	fmt.Fprintf(w, "eztunnel bench trace-paths: host-gw, %d round(s) of %v interleaved (order rotated each round); %d exchanges of %d B per run; client on CPU %s, servers on CPU %s; netfilter timed: %v\n",
		o.Rounds, datapaths, o.N, o.Size, cpuName(o.ClientCPU), cpuName(o.ServerCPU), o.NF)
	fmt.Fprintf(w, "client %s (%s), same-node server %s, cross-node server %s (%s); hosts %s %s, wire %s\n",
		client.IPv4, n1.Name, local.IPv4, remote.IPv4, n2.Name, n1.NetNS, n2.NetNS, l.Underlay)

	var cookies []string
	for _, ns := range []string{n1.NetNS, n2.NetNS, l.Underlay, client.NetNS, local.NetNS, remote.NetNS} {
		c, err := bpfsys.NetNSCookie(ns)
		if err != nil {
			return err
		}
		cookies = append(cookies, fmt.Sprintf("%s=%d", ns, c))
	}
	fmt.Fprintf(w, "netns cookies (the CSV's netns column): %s\n", strings.Join(cookies, " "))

	res := NewResults()
	res.Rounds = o.Rounds
	for r := 0; r < o.Rounds; r++ {
		order := slices.Clone(datapaths)
		for range r % len(order) {
			order = append(order[1:], order[0])
		}
		for _, dp := range order {
			agents, err := bypass.StartAgents(ctx, bypass.Options{Agent: o.Agent, Lab: o.Lab}, dp, tmp, n1, n2)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, dp, err)
			}
			for _, path := range []string{SameNode, CrossNode} {
				for _, proto := range o.Protos {
					k := Key{Path: path, Proto: proto, Datapath: dp}
					if err := traceRun(ctx, o, l, cliWL, client, servers[path], agents, res, k, r); err != nil {
						agents.Stop()
						return fmt.Errorf("round %d, %s, %s %s: %w", r+1, dp, path, proto, err)
					}
					rs := res.runs[k]
					last := rs[len(rs)-1]
					fmt.Fprintf(w, "round %d/%d %-15s %-10s %s: RTT p50 %.1f us, bypassed %.0f, sendmsg %d, complete/all lifetimes: request %d/%d, response %d/%d\n",
						r+1, o.Rounds, dp, path, proto, last.rttP50, last.bypassed, last.sockSend,
						last.complete[0], last.all[0], last.complete[1], last.all[1])
				}
			}
			if err := agents.Stop(); err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, dp, err)
			}
		}
	}
	res.Write(w, datapaths, o.Protos)
	return nil
}

// traceRun runs one workload (k: pod pair, protocol, datapath) under a
// tracer of its own and adds its lifetimes to res.
func traceRun(ctx context.Context, o Options, l *multinode.Lab, wl workload.Client, client, server *multinode.Pod,
	a *bypass.Agents, res *Results, k Key, round int) error {
	cfg := tracer.DefaultConfig()
	cfg.Filter.Port = port
	cfg.Filter.Proto = k.Proto
	cfg.Filter.Host = server.IPv4
	cfg.HostNetNS = []string{l.Node(1).NetNS, l.Node(2).NetNS}
	cfg.WireNetNS = []string{l.Underlay}
	cfg.NetNS = nil
	if o.NF {
		cfg.NetNS = cfg.HostNetNS
	}
	// TCP lifetimes end with the read and are emitted when their address is
	// reused or by the age sweep: sweep often, so the table stays small.
	cfg.MaxAge = 200 * time.Millisecond
	t, err := tracer.Open(cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	var lts []lifetime
	var csvw *tracer.CSVWriter
	if o.CSVDir != "" {
		f, err := os.Create(filepath.Join(o.CSVDir, fmt.Sprintf("%d-%s-%s-%s.csv", round+1, k.Datapath, k.Path, k.Proto)))
		if err != nil {
			return err
		}
		defer f.Close()
		if csvw, err = tracer.NewCSVWriter(f); err != nil {
			return err
		}
		defer csvw.Flush()
	}
	var csvErr error
	tctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runErr = t.Run(tctx, func(r tracer.Record) {
			lts = append(lts, lifetimeOf(&r))
			if csvw != nil && csvErr == nil {
				csvErr = csvw.Write(&r)
			}
		})
	}()
	rn, werr := exchange(ctx, o, wl, client, server, k.Proto, a)
	stop()
	wg.Wait()
	if err := errors.Join(werr, runErr, csvErr); err != nil {
		return err
	}
	c, err := t.Counters()
	if err != nil {
		return err
	}
	if c.Lost() > 0 {
		return fmt.Errorf("tracer lost %d lifetimes (ring drops %d, table full %d)", c.Lost(), c.RingDrops, c.TableFull)
	}
	rn.sockSend = c.SockSend
	for _, lt := range lts {
		res.Add(k, round, server.IPv4, port, lt)
		if d, ok := lt.direction(server.IPv4, port); ok {
			i := 0
			if d == Response {
				i = 1
			}
			rn.all[i]++
			if lt.complete {
				rn.complete[i]++
			}
		}
	}
	res.AddRun(k, rn)
	// The kernel path is always traced: a run of the bridge without complete
	// lifetimes means the tracer does not follow this path any more.
	if k.Datapath == bridgeName {
		for _, dir := range []string{Request, Response} {
			kk := k
			kk.Dir = dir
			if len(res.cell(kk).e2e) == 0 {
				seen := map[string]int{}
				for _, lt := range lts {
					if d, ok := lt.direction(server.IPv4, port); ok && d == dir {
						seen[lt.path]++
					}
				}
				var b strings.Builder
				for range 4 {
					top, n := topPath(seen)
					if n == 0 {
						break
					}
					fmt.Fprintf(&b, "\n  %d: %s", n, top)
					delete(seen, top)
				}
				return fmt.Errorf("%s on the bridge: no complete lifetime (of %d) traced; most common paths:%s", dir, res.cell(kk).lifetimes, b.String())
			}
		}
	}
	return nil
}

// exchange runs o.N request/response exchanges from client to server (TCP:
// one connection, with 200 warm-up exchanges; UDP: one socket) and reads
// the agents' bypass counter around it.
func exchange(ctx context.Context, o Options, wl workload.Client, client, server *multinode.Pod, proto string, a *bypass.Agents) (run, error) {
	var rn run
	b0, err := a.Bypassed()
	if err != nil {
		return rn, err
	}
	addr := netip.AddrPortFrom(server.IPv4, port).String()
	switch proto {
	case "tcp":
		var pp workload.PingPongResult
		if _, err := wl.Workload(ctx, client, 2*time.Minute, &pp, "pingpong", "--addr", addr, "--size", strconv.Itoa(o.Size),
			"--n", strconv.Itoa(o.N), "--warmup", "200"); err != nil {
			return rn, fmt.Errorf("TCP ping-pong: %w", err)
		}
		rn.rttP50 = pp.Micros.P50
	default:
		var ur workload.UDPResult
		if _, err := wl.Workload(ctx, client, 2*time.Minute, &ur, "udp", "--addr", addr, "--size", strconv.Itoa(o.Size),
			"--n", strconv.Itoa(o.N)); err != nil {
			return rn, fmt.Errorf("UDP ping-pong: %w", err)
		}
		if ur.Echoed < ur.Sent*99/100 {
			return rn, fmt.Errorf("UDP ping-pong: %d of %d datagrams echoed", ur.Echoed, ur.Sent)
		}
		rn.rttP50 = ur.Micros.P50
	}
	b1, err := a.Bypassed()
	if err != nil {
		return rn, err
	}
	rn.bypassed = b1 - b0
	return rn, nil
}

// startServers runs a TCP echo and a UDP echo server on port in p.
func startServers(ctx context.Context, wl workload.Client, p *multinode.Pod, tmp string, o Options) (stop func(), err error) {
	addr := netip.AddrPortFrom(p.IPv4, port).String()
	srv, err := wl.Serve(ctx, p, tmp, "--echo", addr)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	cmd := p.Cmd(cctx, o.Lab, "workload", "udp", "--serve", addr)
	if err := wl.Start(p, cmd); err != nil {
		cancel()
		srv.Stop()
		return nil, fmt.Errorf("UDP echo in %s: %w", p.Name, err)
	}
	time.Sleep(300 * time.Millisecond) // the UDP server has no ready file
	return func() { cancel(); cmd.Wait(); srv.Stop() }, nil
}

func placement(cpu int) workload.Placement {
	if cpu < 0 {
		return workload.Placement{}
	}
	return workload.Placement{CPUs: []int{cpu}}
}

func cpuName(c int) string {
	if c < 0 {
		return "any"
	}
	return strconv.Itoa(c)
}
