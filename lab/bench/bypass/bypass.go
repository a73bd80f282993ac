// Package bypass is `eztunnel-lab bench bypass`: the bridge bypass in the
// multi-node lab (lab/multinode), in each routing mode, for three datapaths
// run in interleaved rounds: the bridge and the node's iptables (no agent),
// the tc bypass (an agent per node with --bypass and the socket shortcut
// excluded), and the bypass with the shortcut. For a same-node and a
// cross-node pod pair it measures TCP and UDP round trips, one TCP stream's
// throughput and small-UDP packets per second, and it reads the agents'
// bypass counters to say what was really bypassed.
package bypass

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/parts"

	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Options configure a run.
type Options struct {
	Agent     string           // the eztunnel binary
	Lab       string           // the eztunnel-lab binary (workloads)
	Modes     []multinode.Mode // routing modes, each a lab of its own
	Rounds    int              // interleaved rounds of the three datapaths
	RTTN      int              // round trips per RTT measurement
	Seconds   int              // length of each iperf3 test
	IPv6      bool             // pods talk IPv6 (the underlay of VXLAN stays IPv4)
	ClientCPU int              // CPU of every client; -1: any
	ServerCPU int              // CPU of every server; -1: any
	// Datapaths to compare, in the report's order (ParseDatapaths); nil:
	// bridge, bypass and bypass+shortcut.
	Datapaths []string
	// Pairs > 0: paired mode (paired.go) instead of rounds: the bypass
	// against its own kernel path on the same flows, Pairs quads of
	// phases of Phase each.
	Pairs int
	Phase time.Duration
	// Blocks: the quads of each row run in this many blocks, the rows'
	// blocks interleaved, each block on fresh flows; the interval
	// resamples blocks (bench.ComparePairedBlocks). 0: Pairs/20, at
	// least 1 (bypass paired mode only).
	Blocks int
	// Raw, with Pairs and PairBypass: a file to write every phase's value
	// to as CSV (WriteRaw), so the report can be recomputed and studied.
	Raw string
	// Pair is what paired mode compares: PairBypass ("" too) or PairIdle
	// (idlepair.go: the idle agent against no agent, its links detached).
	Pair string
	// Paths are the paths --pair idle measures (same-node, cross-node);
	// nil: both.
	Paths []string
	// SwitchLinks, with --pair idle: only the links whose name matches
	// this regular expression are detached in A (idlelinks.go, linkName);
	// the others stay attached on both sides. "": all.
	SwitchLinks string
	// TCHooksOn, with --pair idle: a clsact qdisc without filters on each
	// node's loopback for the whole run, so the kernel's tc hook checks on
	// every packet (its ingress and egress static keys) are on in A too,
	// as on a node whose CNI has tc programs.
	TCHooksOn bool
}

// Datapaths, in the order of the report.
const (
	Bridge   = "bridge"
	Bypass   = "bypass"
	Shortcut = "bypass+shortcut"
	// Idle is an agent on each node that accelerates nothing (no bypass,
	// every connection excluded from the shortcut): what stays attached
	// costs the paths it does not accelerate.
	Idle = "agent idle"
	// IdlePsock is Idle with reads counted where only sockets with a psock
	// pay (NoReadTracepoint).
	IdlePsock = "agent idle, no read tracepoint"
	// IdleNarrow is Idle without the hooks that run for the whole node on
	// this host (NoNodeWideHooks), only --pair idle-narrow.
	IdleNarrow = "agent idle, no node-wide hooks"
	// IdleUnselected is IdleNarrow for pods the agent does not select: it
	// selects one other pod per node (as Kubernetes mode does, without a
	// cluster) and attaches the close reset only to the devices of the
	// selected pods' namespaces (--close-reset-devices=covered); only
	// --pair idle-unselected.
	IdleUnselected = "agent idle, pods not selected, close reset on covered devices"
)

// NoReadTracepoint is what an agent refuses to count reads where only
// sockets with a psock pay: ez_sc_recv (tp_btf/sock_recv_length, which runs
// for every recvmsg on the node), so ez_sc_recv_fx (fexit/tcp_bpf_recvmsg)
// counts where the host allows fexit, else the gauge (docs/kernels.md).
// What an idle agent costs on a host that allows fexit, measured on one
// that does not.
var NoReadTracepoint = []string{"ez_sc_recv"}

// NoNodeWideHooks are the programs an agent refuses so that none of its
// hooks runs for the whole node: the read tracepoint (NoReadTracepoint)
// and the splice guard's syscall hooks (ez_sc_splice_tp refused takes the
// events' group, ez_sc_sendfile_tp with it; ez_sc_splice is the raw
// tracepoint after them), whose events send every syscall of the node
// through the slow entry path. Where the host allows fentry and fexit the
// agent uses hooks that run for psock sockets and TCP splices only (fexit
// on tcp_bpf_recvmsg, fentry on tcp_splice_read), so this is what an idle
// agent costs the paths it does not accelerate there, measured here.
var NoNodeWideHooks = []string{"ez_sc_recv", "ez_sc_splice_tp", "ez_sc_splice"}

// nodeWideHooks are those of NoNodeWideHooks this host would run: where
// fexit on tcp_bpf_recvmsg loads (or the read tracepoint is missing) the
// agent does not use ez_sc_recv, and where fentry on tcp_splice_read loads
// it does not use the syscall hooks, so there is nothing to refuse.
// Probed once per process (each probe loads a program); each call returns
// a new slice.
func nodeWideHooks() []string { return slices.Clone(probedNodeWideHooks()) }

var probedNodeWideHooks = sync.OnceValue(func() []string {
	var out []string
	if bpfsys.Fexit("tcp_bpf_recvmsg")() != nil && bpfsys.Tracepoint("sock_recv_length")() == nil {
		out = append(out, NoNodeWideHooks[0])
	}
	if bpfsys.Fentry("tcp_splice_read")() != nil {
		out = append(out, NoNodeWideHooks[1:]...)
	}
	return out
})

// PsockRefusals are the programs an IdlePsock agent refuses on this host:
// the read tracepoint, only where this host would run it (nodeWideHooks);
// none where fexit on tcp_bpf_recvmsg loads. A new slice each call.
func PsockRefusals() []string {
	return slices.DeleteFunc(nodeWideHooks(), func(p string) bool { return !slices.Contains(NoReadTracepoint, p) })
}

// IdleArgs are the flags of an agent that accelerates nothing (Idle,
// IdlePsock, IdleNarrow; bench mesh-matrix's idle configurations too).
var IdleArgs = []string{"--bypass=false", "--exclude-cidrs", "0.0.0.0/0,::/0"}

var datapaths = []string{Bridge, Bypass, Shortcut}

// ParseDatapaths reads --datapaths names (bridge, bypass, shortcut, idle)
// into datapaths in the report's order; the bridge always runs.
func ParseDatapaths(names []string) ([]string, error) {
	byName := map[string]string{"bridge": Bridge, "bypass": Bypass, "shortcut": Shortcut, "idle": Idle, "idle-psock": IdlePsock}
	want := map[string]bool{Bridge: true}
	for _, n := range names {
		dp, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("datapath %q: not one of bridge, bypass, shortcut, idle, idle-psock", n)
		}
		want[dp] = true
	}
	var out []string
	for _, dp := range []string{Bridge, Idle, IdlePsock, Bypass, Shortcut} {
		if want[dp] {
			out = append(out, dp)
		}
	}
	return out, nil
}

// Paths: the client pod talks to a pod of its node and to one of the other.
var paths = []string{"same-node", "cross-node"}

// floorPath is the same-node pair over a veth pair of their own
// (multinode.Wire), measured in the bridge's turn of each round: the floor
// of any datapath between pods on veths.
const floorPath = "same-node, one veth"

// measureFloor measures the same-node pair over their wire, its routes on
// for the measurement only.
func measureFloor(ctx context.Context, o Options, wl workload.Client, client, server *multinode.Pod, wire *multinode.Wire, a *agents) (s sample, err error) {
	if err := wire.Route(true); err != nil {
		return s, err
	}
	defer func() {
		if rerr := wire.Route(false); rerr != nil && err == nil {
			err = rerr
		}
	}()
	return measure(ctx, o, wl, client, server, a)
}

// Metrics, with whether lower is better.
type metric struct {
	name  string
	lower bool
}

var metrics = []metric{
	{"TCP RTT p50 (us)", true}, {"TCP RTT p99 (us)", true}, {"TCP RTT CPU per round trip (us)", true},
	{"UDP RTT p50 (us)", true}, {"UDP RTT p99 (us)", true},
	{"TCP stream (Gbit/s)", false}, {"UDP 64 B (kpps received)", false},
}

// Ports of the servers in each server pod.
const (
	echoPort  = 7000
	udpPort   = 7001
	iperfPort = 5201
	// streamPort: the workload stream server (paired mode's streams).
	streamPort = 7002
	metrics0   = "127.0.0.1:9464" // each agent's metrics, in its node's namespace
)

// sample is one measurement of every metric on one path, plus what the
// agents bypassed meanwhile.
type sample struct {
	values   map[string]float64
	bypassed float64 // packets bypassed, both nodes: same node, out to and in from the other node (a cross-node packet counts on each)
	paired   float64 // connections on the shortcut (eztunnel_pairs_total)
	// fallbacks: packets the bypass left on the kernel path, by reason (both nodes)
	fallbacks map[string]float64
}

// Run measures every mode and writes the report to w.
func Run(ctx context.Context, o Options, w io.Writer) error {
	if o.Pairs > 0 {
		return runPairedModes(ctx, o, w)
	}
	if o.Blocks != 0 {
		return fmt.Errorf("bench bypass --blocks %d: only with --pairs", o.Blocks)
	}
	if o.Raw != "" {
		return fmt.Errorf("bench bypass --raw %s: only with --pairs", o.Raw)
	}
	if o.TCHooksOn || o.SwitchLinks != "" || o.Pair != "" && o.Pair != PairBypass {
		return errors.New("bench bypass --pair, --switch-links, --tc-hooks-on: only with --pairs")
	}
	if o.Rounds < 1 || o.RTTN < 100 || o.Seconds < 1 {
		return fmt.Errorf("bench bypass: rounds %d (>= 1), rtt-n %d (>= 100), seconds %d (>= 1)", o.Rounds, o.RTTN, o.Seconds)
	}
	if len(o.Modes) == 0 {
		return errors.New("bench bypass: no routing mode")
	}
	if o.Datapaths == nil {
		o.Datapaths = datapaths
	}
	fmt.Fprintf(w, "eztunnel bench bypass: %d mode(s) x %d round(s), datapaths interleaved (order rotated each round); client on CPU %s, servers on CPU %s; IPv6 %v\n",
		len(o.Modes), o.Rounds, cpuName(o.ClientCPU), cpuName(o.ServerCPU), o.IPv6)
	results := map[multinode.Mode]map[string]map[string][]sample{}
	for _, mode := range o.Modes {
		r, err := runMode(ctx, o, mode, w)
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
		results[mode] = r
	}
	report(w, o, results)
	return nil
}

func cpuName(c int) string {
	if c < 0 {
		return "any"
	}
	return strconv.Itoa(c)
}

// benchLab is a two-node lab with a client pod, a same-node and a
// cross-node server pod (their servers running) and a wire between the
// client and the same-node server.
type benchLab struct {
	n1, n2  *multinode.Node
	client  *multinode.Pod
	servers map[string]*multinode.Pod // by path
	wire    *multinode.Wire
	tmp     string
}

// withLab builds the lab of mode, runs fn in it and removes it.
func withLab(ctx context.Context, o Options, mode multinode.Mode, w io.Writer, fn func(*benchLab) error) (err error) {
	l, err := NewLab("bbp", mode, pinPrefix)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	b := &benchLab{n1: l.Node(1), n2: l.Node(2)}
	if b.client, err = b.n1.AddPod("c", true); err != nil {
		return err
	}
	local, err := b.n1.AddPod("s", true)
	if err != nil {
		return err
	}
	remote, err := b.n2.AddPod("r", true)
	if err != nil {
		return err
	}
	b.servers = map[string]*multinode.Pod{"same-node": local, "cross-node": remote}
	if b.wire, err = b.client.AddWire(local); err != nil {
		return err
	}
	if b.tmp, err = os.MkdirTemp("", "eztunnel-bench-bypass-"); err != nil {
		return err
	}
	defer os.RemoveAll(b.tmp)
	srvWL := workload.Client{Exe: o.Lab, Placement: placement(o.ServerCPU)}
	for _, p := range []*multinode.Pod{local, remote} {
		stop, err := startServers(ctx, srvWL, p, b.tmp, o)
		if err != nil {
			return err
		}
		defer stop()
	}
	fmt.Fprintf(w, "%s: client %s (%s), same-node server %s, cross-node server %s (%s)\n", mode,
		b.client.Addr(o.IPv6), b.n1.Name, local.Addr(o.IPv6), remote.Addr(o.IPv6), b.n2.Name)
	return fn(b)
}

// runMode builds a two-node lab in mode and runs the rounds.
func runMode(ctx context.Context, o Options, mode multinode.Mode, w io.Writer) (out map[string]map[string][]sample, err error) {
	err = withLab(ctx, o, mode, w, func(b *benchLab) error {
		out, err = runRounds(ctx, o, mode, b, w)
		return err
	})
	return out, err
}

// runRounds runs the interleaved rounds of the datapaths in b.
func runRounds(ctx context.Context, o Options, mode multinode.Mode, b *benchLab, w io.Writer) (map[string]map[string][]sample, error) {
	n1, n2, client, local, servers, wire, tmp := b.n1, b.n2, b.client, b.servers["same-node"], b.servers, b.wire, b.tmp
	cliWL := workload.Client{Exe: o.Lab, Placement: placement(o.ClientCPU)}
	out := map[string]map[string][]sample{}
	for _, dp := range o.Datapaths {
		out[dp] = map[string][]sample{}
	}
	for r := 0; r < o.Rounds; r++ {
		order := slices.Clone(o.Datapaths)
		for range r % len(order) {
			order = append(order[1:], order[0])
		}
		for _, dp := range order {
			agents, err := startAgents(ctx, o, dp, tmp, n1, n2)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", r+1, dp, err)
			}
			for _, path := range paths {
				s, err := measure(ctx, o, cliWL, client, servers[path], agents)
				if err != nil {
					agents.stop()
					return nil, fmt.Errorf("round %d, %s, %s: %w", r+1, dp, path, err)
				}
				out[dp][path] = append(out[dp][path], s)
				fmt.Fprintf(w, "%s round %d/%d %-15s %-10s %s\n", mode, r+1, o.Rounds, dp, path, s.line())
			}
			if dp == Bridge {
				s, err := measureFloor(ctx, o, cliWL, client, local, wire, agents)
				if err != nil {
					agents.stop()
					return nil, fmt.Errorf("round %d, %s: %w", r+1, floorPath, err)
				}
				out[dp][floorPath] = append(out[dp][floorPath], s)
				fmt.Fprintf(w, "%s round %d/%d %-15s %-10s %s\n", mode, r+1, o.Rounds, "one veth", "same-node", s.line())
			}
			if err := agents.stop(); err != nil {
				return nil, fmt.Errorf("round %d, %s: %w", r+1, dp, err)
			}
		}
	}
	return out, nil
}

func placement(cpu int) workload.Placement {
	if cpu < 0 {
		return workload.Placement{}
	}
	return workload.Placement{CPUs: []int{cpu}}
}

func (s sample) line() string {
	var b strings.Builder
	for _, m := range metrics {
		fmt.Fprintf(&b, "%s %.1f, ", strings.TrimSuffix(m.name, ")"), s.values[m.name])
	}
	fmt.Fprintf(&b, "bypassed %.0f packets, %.0f shortcut pairs", s.bypassed, s.paired)
	if len(s.fallbacks) > 0 {
		reasons := make([]string, 0, len(s.fallbacks))
		for r := range s.fallbacks {
			reasons = append(reasons, r)
		}
		sort.Slice(reasons, func(i, j int) bool { return s.fallbacks[reasons[i]] > s.fallbacks[reasons[j]] })
		b.WriteString("; fallbacks")
		for _, r := range reasons[:min(4, len(reasons))] {
			fmt.Fprintf(&b, " %s %.0f", r, s.fallbacks[r])
		}
	}
	return strings.ReplaceAll(b.String(), " (", " ")
}

// startServers runs the echo (TCP), UDP echo and iperf3 servers in p.
func startServers(ctx context.Context, wl workload.Client, p *multinode.Pod, tmp string, o Options) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	addr := func(port int) string { return netip.AddrPortFrom(p.Addr(o.IPv6), uint16(port)).String() }
	srv, err := wl.Serve(ctx, p, tmp, "--echo", addr(echoPort), "--stream", addr(streamPort))
	if err != nil {
		return stop, err
	}
	stops = append(stops, srv.Stop)
	for _, argv := range [][]string{
		{o.Lab, "workload", "udp", "--serve", addr(udpPort)},
		{"iperf3", "--server", "--bind", p.Addr(o.IPv6).String(), "--port", strconv.Itoa(iperfPort)},
	} {
		cctx, cancel := context.WithCancel(ctx)
		cmd := p.Cmd(cctx, argv[0], argv[1:]...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := wl.Start(p, cmd); err != nil {
			cancel()
			return stop, fmt.Errorf("%s in %s: %w", argv[0], p.Name, err)
		}
		stops = append(stops, func() { cancel(); cmd.Wait() })
	}
	time.Sleep(300 * time.Millisecond) // the UDP and iperf3 servers have no ready file
	return stop, nil
}

// pinPrefix: the agent of node n pins its datapath at pinPrefix + n.NetNS.
const pinPrefix = "/sys/fs/bpf/eztunnel-bench-"

// Before a datapath is measured the machine settles (bench.Settle): all
// CPUs together below settleQuiet of one CPU, for at most settleMax.
const (
	settleMax   = 5 * time.Second
	settleQuiet = 0.25
)

// sweepPinsAt uninstalls what agents pinning at prefix + a node's netns
// name left pinned (a killed run).
func sweepPinsAt(prefix string, nodes ...*multinode.Node) error {
	for _, n := range nodes {
		cfg := datapath.DefaultConfig()
		cfg.PinRoot = prefix + n.NetNS
		if _, err := os.Stat(cfg.PinRoot); err == nil {
			if err := datapath.Uninstall(cfg, 0); err != nil {
				return fmt.Errorf("pins of a killed run at %s: %w", cfg.PinRoot, err)
			}
			os.Remove(cfg.PinRoot)
		}
	}
	return nil
}

// agents is one eztunnel agent per node, or none (the bridge).
type agents struct {
	exe   string
	nodes []*multinode.Node
	cmds  []*agentProc
	pins  []string
	// uninstalled: what they pinned is gone (stop and uninstall run once).
	uninstalled bool
}

// agentProc is one running agent: stop sends SIGTERM and waits.
type agentProc struct {
	stop func() error
	logs *bytes.Buffer
}

// startAgents starts an agent in each node's namespace for the bypass
// datapaths and waits until each is ready and has discovered its node's pods.
func startAgents(ctx context.Context, o Options, dp string, tmp string, nodes ...*multinode.Node) (a *agents, err error) {
	// What starting these agents, or stopping and uninstalling the last
	// ones, left running (program loads, the kernel freeing maps) is not
	// this datapath's cost.
	defer func() {
		if err == nil {
			_, err = bench.Settle(settleMax, settleQuiet)
		}
	}()
	if dp == Bridge {
		return &agents{exe: o.Agent}, nil
	}
	spec := AgentSpec{Exe: o.Agent, PinPrefix: pinPrefix, Args: []string{"--bypass"}, Endpoints: true, IPv6: o.IPv6}
	switch dp {
	case Bypass:
		// Every connection excluded from the shortcut: tc only.
		spec.Args = append(spec.Args, "--exclude-cidrs", "0.0.0.0/0,::/0")
	case Idle, IdlePsock, IdleNarrow:
		spec = AgentSpec{Exe: o.Agent, PinPrefix: pinPrefix, Args: IdleArgs, IPv6: o.IPv6}
		switch dp {
		case IdlePsock:
			spec.Refused = PsockRefusals()
		case IdleNarrow:
			spec.Refused = nodeWideHooks()
		}
	case IdleUnselected:
		spec = AgentSpec{Exe: o.Agent, PinPrefix: pinPrefix, Args: []string{"--bypass=false", "--close-reset-devices", "covered"}, IPv6: o.IPv6,
			Refused: nodeWideHooks(), Selected: selectedPods}
	}
	return runAgents(ctx, spec, tmp, nodes...)
}

// AgentSpec is how each node's agent runs (bench bypass, bench mesh-matrix).
type AgentSpec struct {
	Exe       string   // the eztunnel binary
	PinPrefix string   // node n's agent pins at PinPrefix + n.NetNS
	Args      []string // flags beyond cgroup, pins, lock, metrics (at metrics0) and ready file
	// Endpoints: wait until the bypass has each of the node's pods as an
	// endpoint (probing their IPv6 addresses with IPv6, else IPv4).
	Endpoints bool
	IPv6      bool
	// Refused are programs the agent refuses as a kernel would
	// (EZTUNNEL_TEST_REFUSE_PROGRAMS): their parts turn off or fall back.
	// Each must be named by a part's reason or mechanism in the agent's
	// parts report, so a misspelt name fails the run instead of measuring
	// the agent with nothing refused.
	Refused []string
	// Selected, when set, gives the cgroups the agent on a node selects,
	// as Kubernetes mode would (the agent's EZTUNNEL_TEST_SCOPE).
	Selected func(n *multinode.Node) []string
}

// selectedPods are a node's bystander pods (IdleUnselected).
func selectedPods(n *multinode.Node) []string {
	var out []string
	for _, p := range n.Pods() {
		if p.Name == bystanderPod+n.Name {
			out = append(out, p.Cgroup)
		}
	}
	return out
}

// testScopeEnv is the agent's fixed pod selection in plain mode
// (internal/agent: for benches only).
const testScopeEnv = "EZTUNNEL_TEST_SCOPE"

// bystanderPod and the node's name name the pod of each node that --pair idle-unselected's
// agents select: it runs a process, and carries no measured flow.
const bystanderPod = "y"

// checkRefused fails unless the parts report of the agent pinned at pin
// names each of refused as what turned a part off or made it fall back.
func checkRefused(pin string, refused []string) error {
	if len(refused) == 0 {
		return nil
	}
	rep, err := parts.Read(datapath.Config{PinRoot: pin}.Layout().Report())
	if err != nil {
		return fmt.Errorf("parts report: %w", err)
	}
	for _, prog := range refused {
		// The whole name: ez_sc_nat must not pass on ez_sc_nat_ct's refusal.
		named := regexp.MustCompile(`\b` + regexp.QuoteMeta(prog) + `\b`)
		if !slices.ContainsFunc(rep.Parts, func(s parts.Status) bool {
			return named.MatchString(s.Reason) || named.MatchString(s.Via)
		}) {
			return fmt.Errorf("%s names %s, but no part of the agent reports it refused (not a program of this build?)", bpfsys.TestRefuseEnv, prog)
		}
	}
	return nil
}

// runAgents starts an agent in each node's namespace as spec says and waits
// until each is ready (and has the node's pods as bypass endpoints).
func runAgents(ctx context.Context, spec AgentSpec, tmp string, nodes ...*multinode.Node) (*agents, error) {
	a := &agents{exe: spec.Exe}
	for _, n := range nodes {
		pin := spec.PinPrefix + n.NetNS
		ready := filepath.Join(tmp, n.NetNS+"-ready")
		os.Remove(ready)
		args := []string{"run", "--cgroup", n.Managed, "--pin-path", pin,
			"--lock-file", filepath.Join(tmp, n.NetNS+".lock"), "--adopt=false",
			"--metrics-addr", metrics0, "--ready-file", ready}
		args = append(args, spec.Args...)
		cctx, cancel := context.WithCancel(ctx)
		cmd := n.Cmd(cctx, spec.Exe, args...)
		var env []string
		if len(spec.Refused) > 0 {
			env = append(env, bpfsys.TestRefuseEnv+"="+strings.Join(spec.Refused, ","))
		}
		if spec.Selected != nil {
			sel := spec.Selected(n)
			if len(sel) == 0 {
				cancel()
				a.stop()
				return nil, fmt.Errorf("agent on %s: no pod to select", n.Name)
			}
			env = append(env, testScopeEnv+"="+strings.Join(sel, ","))
		}
		if env != nil {
			cmd.Env = append(os.Environ(), env...)
		}
		logs := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := n.Start(cmd); err != nil {
			cancel()
			a.stop()
			return nil, fmt.Errorf("agent on %s: %w", n.Name, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		e := &agentProc{logs: logs, stop: func() error {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				cancel()
				return err
			case <-time.After(30 * time.Second):
				cancel()
				return errors.New("no exit 30 s after SIGTERM")
			}
		}}
		a.nodes, a.cmds, a.pins = append(a.nodes, n), append(a.cmds, e), append(a.pins, pin)
		if err := workload.WaitReady(ctx, ready, 30*time.Second, nil); err != nil {
			a.stop()
			return nil, fmt.Errorf("agent on %s: %w\n%s", n.Name, err, logs.String())
		}
		if err := checkRefused(pin, spec.Refused); err != nil {
			a.stop()
			return nil, fmt.Errorf("agent on %s: %w\n%s", n.Name, err, logs.String())
		}
		if spec.Endpoints {
			if err := waitEndpoints(ctx, n, spec.IPv6); err != nil {
				a.stop()
				return nil, fmt.Errorf("agent on %s: %w\n%s", n.Name, err, logs.String())
			}
		}
	}
	return a, nil
}

// waitEndpoints makes node n resolve each of its pods, as kubelet's probes
// do (the bypass learns a pod's MAC from the node's neighbour entry on the
// bridge: podnet), and waits until the agent lists them as endpoints.
func waitEndpoints(ctx context.Context, n *multinode.Node, v6 bool) error {
	pods := n.Pods()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, p := range pods {
			if err := n.Do(func() error {
				c, err := net.Dial("udp", netip.AddrPortFrom(p.Addr(v6), 9).String())
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("probe"))
				return err
			}); err != nil {
				return fmt.Errorf("%s -> %s: %w", n.Name, p.Name, err)
			}
		}
		m, err := Scrape(n, metrics0)
		if err == nil && m["eztunnel_bypass_endpoints"] >= float64(len(pods)) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d pods are bypass endpoints after 20 s (%v)", int(m["eztunnel_bypass_endpoints"]), len(pods), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop stops the agents and uninstalls what they pinned.
func (a *agents) stop() error {
	return errors.Join(a.stopProcs(), a.uninstall())
}

// stopProcs stops the agents; what they pinned stays (an agent leaves its
// datapath attached and working).
func (a *agents) stopProcs() error {
	var errs []error
	for i, e := range a.cmds {
		if err := e.stop(); err != nil {
			errs = append(errs, fmt.Errorf("agent on %s: %w\n%s", a.nodes[i].Name, err, e.logs.String()))
		}
	}
	a.cmds = nil
	return errors.Join(errs...)
}

// uninstall uninstalls what the agents pinned, once.
func (a *agents) uninstall() error {
	if a.uninstalled {
		return nil
	}
	var errs []error
	for i, n := range a.nodes {
		var out bytes.Buffer
		cmd := n.Cmd(context.Background(), a.exe, "uninstall", "--pin-path", a.pins[i], "--drain-timeout", "10s")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n.Run(cmd); err != nil {
			errs = append(errs, fmt.Errorf("uninstall on %s: %w: %s", n.Name, err, out.String()))
		}
	}
	a.uninstalled = true
	return errors.Join(errs...)
}

// counters sums two counters over the agents' metrics, and the bypass's
// fallbacks by reason.
func (a *agents) counters() (bypassed, paired float64, fallbacks map[string]float64, err error) {
	fallbacks = map[string]float64{}
	for _, n := range a.nodes {
		m, err := Scrape(n, metrics0)
		if err != nil {
			return 0, 0, nil, err
		}
		for k, v := range m {
			if r, ok := strings.CutPrefix(k, "fallback "); ok {
				fallbacks[r] += v
			}
		}
		bypassed += m["eztunnel_bypass_packets_total"] + m["eztunnel_bypass_out_packets_total"] + m["eztunnel_bypass_in_packets_total"]
		paired += m["eztunnel_pairs_total"]
	}
	return bypassed, paired, fallbacks, nil
}

// Scrape reads the metrics an agent serves at addr inside its node's
// namespace: unlabelled counters and gauges by name, the bypass's
// fallbacks as "fallback <reason>", the shortcut's as "shortcut fallback
// <reason>" (bench mesh-matrix uses it too).
func Scrape(n *multinode.Node, addr string) (map[string]float64, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = n.Do(func() (err error) {
				var d net.Dialer
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("metrics of the agent on %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			if l := m.GetLabel(); len(l) == 1 && name == "eztunnel_bypass_fallbacks_total" && m.Counter != nil {
				out["fallback "+l[0].GetValue()] += m.GetCounter().GetValue()
				continue
			}
			if l := m.GetLabel(); len(l) == 1 && name == "eztunnel_fallbacks_total" && m.Counter != nil {
				out["shortcut fallback "+l[0].GetValue()] += m.GetCounter().GetValue()
				continue
			}
			if len(m.GetLabel()) > 0 {
				continue
			}
			switch {
			case m.Counter != nil:
				out[name] += m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name] += m.GetGauge().GetValue()
			}
		}
	}
	return out, nil
}

// measure runs every metric from client to server once.
func measure(ctx context.Context, o Options, wl workload.Client, client, server *multinode.Pod, a *agents) (s sample, err error) {
	s.values = map[string]float64{}
	b0, p0, f0, err := a.counters()
	if err != nil {
		return s, err
	}
	addr := func(port int) string { return netip.AddrPortFrom(server.Addr(o.IPv6), uint16(port)).String() }
	var pp workload.PingPongResult
	busy0, err := busySeconds()
	if err != nil {
		return s, err
	}
	if _, err := wl.Workload(ctx, client, 2*time.Minute, &pp, "pingpong", "--addr", addr(echoPort), "--size", "24",
		"--n", strconv.Itoa(o.RTTN), "--warmup", "500"); err != nil {
		return s, fmt.Errorf("TCP ping-pong: %w", err)
	}
	busy1, err := busySeconds()
	if err != nil {
		return s, err
	}
	s.values["TCP RTT p50 (us)"], s.values["TCP RTT p99 (us)"] = pp.Micros.P50, pp.Micros.P99
	// Every CPU's busy time over the whole ping-pong (the workload
	// process's start and warm-up included), per recorded round trip.
	s.values["TCP RTT CPU per round trip (us)"] = (busy1 - busy0) * 1e6 / float64(o.RTTN)
	var ur workload.UDPResult
	if _, err := wl.Workload(ctx, client, 2*time.Minute, &ur, "udp", "--addr", addr(udpPort), "--size", "24",
		"--n", strconv.Itoa(o.RTTN)); err != nil {
		return s, fmt.Errorf("UDP ping-pong: %w", err)
	}
	if ur.Echoed < ur.Sent*99/100 {
		return s, fmt.Errorf("UDP ping-pong: %d of %d datagrams echoed", ur.Echoed, ur.Sent)
	}
	s.values["UDP RTT p50 (us)"], s.values["UDP RTT p99 (us)"] = ur.Micros.P50, ur.Micros.P99
	tcp, err := iperf(ctx, o, wl, client, server, false)
	if err != nil {
		return s, err
	}
	s.values["TCP stream (Gbit/s)"] = tcp.End.SumReceived.BitsPerSecond / 1e9
	udp, err := iperf(ctx, o, wl, client, server, true)
	if err != nil {
		return s, err
	}
	if udp.End.Sum.Seconds > 0 {
		s.values["UDP 64 B (kpps received)"] = float64(udp.End.Sum.Packets-udp.End.Sum.LostPackets) / udp.End.Sum.Seconds / 1e3
	}
	b1, p1, f1, err := a.counters()
	if err != nil {
		return s, err
	}
	s.bypassed, s.paired = b1-b0, p1-p0
	s.fallbacks = map[string]float64{}
	for r, v := range f1 {
		if d := v - f0[r]; d > 0 {
			s.fallbacks[r] = d
		}
	}
	return s, nil
}

// iperfResult is the part of iperf3's JSON report used here.
type iperfResult struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		Sum struct {
			Seconds     float64 `json:"seconds"`
			Packets     int64   `json:"packets"`
			LostPackets int64   `json:"lost_packets"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

// iperf runs one iperf3 client test: a TCP stream, or 64-byte UDP
// datagrams as fast as the sender goes (-b 0).
func iperf(ctx context.Context, o Options, wl workload.Client, client, server *multinode.Pod, udp bool) (iperfResult, error) {
	args := []string{"--client", server.Addr(o.IPv6).String(), "--port", strconv.Itoa(iperfPort), "--json",
		"--time", strconv.Itoa(o.Seconds)}
	if udp {
		args = append(args, "--udp", "--bitrate", "0", "--length", "64")
	}
	cctx, cancel := context.WithTimeout(ctx, time.Duration(o.Seconds+30)*time.Second)
	defer cancel()
	cmd := client.Cmd(cctx, "iperf3", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	var res iperfResult
	err := wl.Start(client, cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if jerr := json.Unmarshal(out.Bytes(), &res); jerr != nil && err == nil {
		err = jerr
	}
	if err == nil && res.Error != "" {
		err = errors.New(res.Error)
	}
	if err != nil {
		return res, fmt.Errorf("iperf3 (udp %v): %w: %s", udp, err, tail(out.String(), 400))
	}
	return res, nil
}

// report prints, per mode and path, each metric's median over rounds for
// every datapath, and the median of the per-round ratios to the bridge.
func report(w io.Writer, o Options, results map[multinode.Mode]map[string]map[string][]sample) {
	fmt.Fprintf(w, "\nmedians over %d round(s); change: median of the per-round changes against the bridge in the same round\n\n", o.Rounds)
	header := append([]string{"mode", "path", "metric"}, o.Datapaths...)
	for _, dp := range o.Datapaths[1:] {
		header = append(header, dp+" vs bridge")
	}
	rows := [][]string{header}
	for _, mode := range o.Modes {
		r := results[mode]
		for _, path := range paths {
			for i, m := range metrics {
				row := []string{"", "", m.name}
				if i == 0 {
					row[0], row[1] = string(mode), path
				}
				for _, dp := range o.Datapaths {
					row = append(row, fmt.Sprintf("%.1f", median(values(r[dp][path], m.name))))
				}
				for _, dp := range o.Datapaths[1:] {
					row = append(row, change(r[Bridge][path], r[dp][path], m.name))
				}
				rows = append(rows, row)
			}
			bp := []string{"", "", "packets bypassed per measurement"}
			for _, dp := range o.Datapaths {
				var xs []float64
				for _, s := range r[dp][path] {
					xs = append(xs, s.bypassed)
				}
				bp = append(bp, fmt.Sprintf("%.0f", median(xs)))
			}
			for range o.Datapaths[1:] {
				bp = append(bp, "")
			}
			rows = append(rows, bp)
		}
	}
	var b strings.Builder
	bench.WriteTable(&b, rows[0], rows[1:])
	io.WriteString(w, b.String())
	reportFloor(w, o, results)
}

// reportFloor prints the floor (floorPath) against the bridge's same-node
// path of the same rounds, beside each datapath's change: how much of the
// bridge's time any datapath on veths could remove.
func reportFloor(w io.Writer, o Options, results map[multinode.Mode]map[string]map[string][]sample) {
	fmt.Fprintf(w, "\nfloor: the same-node pods over one veth pair of their own (no bridge, no node namespace, no agent), in the bridge's turn of each round\n\n")
	header := []string{"mode", "metric", "bridge", "one veth", "one veth vs bridge"}
	for _, dp := range o.Datapaths[1:] {
		header = append(header, dp+" vs bridge")
	}
	var rows [][]string
	for _, mode := range o.Modes {
		r := results[mode]
		for i, m := range metrics {
			row := []string{"", m.name}
			if i == 0 {
				row[0] = string(mode)
			}
			row = append(row, fmt.Sprintf("%.1f", median(values(r[Bridge]["same-node"], m.name))),
				fmt.Sprintf("%.1f", median(values(r[Bridge][floorPath], m.name))),
				change(r[Bridge]["same-node"], r[Bridge][floorPath], m.name))
			for _, dp := range o.Datapaths[1:] {
				row = append(row, change(r[Bridge]["same-node"], r[dp]["same-node"], m.name))
			}
			rows = append(rows, row)
		}
	}
	var b strings.Builder
	bench.WriteTable(&b, header, rows)
	io.WriteString(w, b.String())
}

// busySeconds is the busy time of every CPU since boot (bench.SystemBusy).
func busySeconds() (float64, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, err
	}
	return bench.SystemBusy(fs)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func values(ss []sample, name string) []float64 {
	var xs []float64
	for _, s := range ss {
		xs = append(xs, s.values[name])
	}
	return xs
}

// change is the median over rounds of (x / bridge - 1), in percent.
func change(bridge, x []sample, name string) string {
	var ch []float64
	for i := range min(len(bridge), len(x)) {
		if b := bridge[i].values[name]; b > 0 {
			ch = append(ch, (x[i].values[name]/b-1)*100)
		}
	}
	if len(ch) == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f%%", median(ch))
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
