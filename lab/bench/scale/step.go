package scale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Row is one step's measurements.
type Row struct {
	Conns      int    `json:"conns"`
	Procs      int    `json:"processes_per_side"`
	MaxSockets uint32 `json:"max_sockets"` // the agent's --max-sockets
	MaxPairs   uint32 `json:"max_pairs"`   // its --max-pairs
	// SetupSeconds: the slowest holder's time from its first connect until
	// each of its connections was open and had its hello echoed (the
	// holders open theirs at the same time); SetupWallSeconds: from
	// starting the holder processes until the last was ready.
	SetupWallSeconds float64 `json:"setup_wall_seconds"`
	SetupSeconds     float64 `json:"setup_seconds"`
	SetupRate        float64 `json:"setup_per_second"`
	Pairs            uint64  `json:"pairs"` // pairs the datapath made (the probe's too)
	// The probe: 24 B round trips on one fresh connection beside the held ones.
	RTT rttStats `json:"probe_rtt_us"`
	// CPUPerMsg: CPU time of the probe client and its echo server while
	// the probe ran, per message (a round trip is two); MachineCPUPerMsg:
	// the whole machine's busy time (/proc/stat) per message, other work
	// included; ProbeCPUPerMsg: the client's own.
	CPUPerMsg        float64 `json:"cpu_us_per_message"`
	MachineCPUPerMsg float64 `json:"machine_cpu_us_per_message"`
	ProbeCPUPerMsg   float64 `json:"probe_client_cpu_us_per_message"`
	// CPUPerMsgRuns: CPUPerMsg of each shortcut run of the probe (the
	// median is reported).
	CPUPerMsgRuns []float64 `json:"cpu_us_per_message_runs"`
	// The same probe over plain TCP between the same pods (its port
	// excluded from acceleration), in alternation with the shortcut's
	// runs (probe.go): CPU per message, each run's and the median, and
	// the round trip's p50.
	PlainCPUPerMsg     float64   `json:"plain_cpu_us_per_message"`
	PlainCPUPerMsgRuns []float64 `json:"plain_cpu_us_per_message_runs"`
	PlainRTTP50        float64   `json:"plain_rtt_p50_us"`
	// CPUVsPlain: the shortcut's CPU per message against plain TCP's,
	// paired run by run; CPUAA: the shortcut's against itself (the A/A
	// control: its interval must hold 0 and be within ±2%).
	CPUVsPlain bench.Paired `json:"cpu_shortcut_vs_plain"`
	CPUAA      bench.Paired `json:"cpu_aa"`
	// The gauge (probe.go): the same probe over the loopback of a pod
	// with its own TCP hash, run next to each plain TCP run. GaugeCPUPerMsg:
	// its median CPU per message; CPUOverGauge, PlainOverGauge: each
	// quad's shortcut and plain TCP run over its gauge run, the costs with
	// the host's drift divided out.
	GaugeCPUPerMsg float64   `json:"gauge_cpu_us_per_message"`
	CPUOverGauge   []float64 `json:"cpu_over_gauge_runs"`
	PlainOverGauge []float64 `json:"plain_cpu_over_gauge_runs"`
	// AgentCPUPerMsgRuns: the agent's CPU time in each run, per message
	// (its periodic work, not on the message path).
	AgentCPUPerMsgRuns []float64 `json:"agent_cpu_us_per_message_runs"`
	// AgentIdleCPU: the agent's CPU time over the idle window (60 s) with
	// the connections idle, in CPUs (0.05: 5% of one).
	AgentIdleCPU float64 `json:"agent_idle_cpus"`
	AgentRSS     uint64  `json:"agent_rss_bytes"`
	// ProgNsPerMsg: the shortcut programs' run time per probe message
	// (ez_sc_msg, ez_sc_recv and the rest of the agent's, summed), from
	// more probe runs with BPF run-time statistics on (progCost); ProgNs
	// by program.
	ProgNsPerMsg float64            `json:"prog_ns_per_message"`
	ProgNs       map[string]float64 `json:"prog_ns_per_message_by_program"`
	// ProgNsRuns: the programs' ns a message in each shortcut run with
	// the statistics on (ProgNsPerMsg is their median; ProgNs by program
	// is over all of them); ProgOverGauge: each over its neighbouring
	// gauge run's CPU per message (ns over ns), the host's drift divided
	// out.
	ProgNsRuns    []float64 `json:"prog_ns_per_message_runs"`
	ProgOverGauge []float64 `json:"prog_over_gauge_runs"`
	// AgentRSSPeak: the agent's largest RSS from its start to the end of
	// the idle window (VmHWM), before the listing: its adoption rounds and
	// walks included.
	AgentRSSPeak uint64 `json:"agent_rss_peak_bytes"`
	MapBytes     uint64 `json:"bpf_map_bytes"`
	ProgBytes    uint64 `json:"bpf_prog_bytes"`
	// MapBytesByMap: the agent's maps by name, with the connections held.
	MapBytesByMap map[string]uint64 `json:"bpf_map_bytes_by_map"`
	// AgentBytesPerConn: (agent RSS + BPF maps) / connections.
	AgentBytesPerConn float64 `json:"agent_bytes_per_conn"`
	// NodeBytesPerConn: the fall of MemAvailable from before the agent
	// started to all connections open, per connection: both sockets, the
	// workloads, the agent, conntrack.
	NodeBytesPerConn float64 `json:"node_bytes_per_conn"`
	// TCPMemBytes: the kernel's TCP memory with every connection open
	// (sockstat; net.ipv4.tcp_mem bounds it for the whole machine).
	TCPMemBytes     uint64 `json:"tcp_mem_bytes"`
	MemAvailableLow uint64 `json:"mem_available_low_bytes"`
	// AgentRSSAfterListing: the agent's RSS once it answered the listing.
	AgentRSSAfterListing uint64  `json:"agent_rss_after_listing_bytes"`
	ListingSeconds       float64 `json:"listing_seconds"`
	ListingBytes         int64   `json:"listing_bytes"`
	ListedEnds           int     `json:"listed_ends"`
	ListingError         string  `json:"listing_error,omitempty"`
	// FromPinsSeconds, FromPinsEnds: a listing from the pins
	// (--from-pins), timed when the one through the agent failed.
	FromPinsSeconds float64 `json:"listing_from_pins_seconds,omitempty"`
	FromPinsEnds    int     `json:"listing_from_pins_ends,omitempty"`
	ScrapeSeconds   float64 `json:"scrape_seconds"`
	ScrapeBytes     int64   `json:"scrape_bytes"`
	// FillWalkSeconds: eztunnel_map_fill_walk_seconds in the scrape, the
	// agent's last walk of its maps to count their entries (every 30 s).
	FillWalkSeconds float64 `json:"map_fill_walk_seconds"`
	// FillWalkCPUSeconds: eztunnel_map_fill_walk_cpu_seconds, that walk's
	// CPU time (the next walk waits 20 times as long, at least 30 s).
	FillWalkCPUSeconds float64 `json:"map_fill_walk_cpu_seconds"`
	UninstallSeconds   float64 `json:"uninstall_seconds"`
	UninstallError     string  `json:"uninstall_error,omitempty"`
	// UninstallLeft: what a failed uninstall left (ends by role, the
	// servers' states); UninstallRerunSeconds: the rerun's time.
	UninstallLeft         string  `json:"uninstall_left,omitempty"`
	UninstallRerunSeconds float64 `json:"uninstall_rerun_seconds,omitempty"`
	// Rounds: a message on every connection accelerated, the unread
	// messages of the uninstall, one on every connection after it.
	Rounds []workload.ScaleRound `json:"rounds"`
	Exact  bool                  `json:"exact"`
}

// rttStats is the probe's round-trip percentiles (us).
type rttStats struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// proc is a server or holder process of a step.
type proc struct {
	cmd  *exec.Cmd
	dir  string        // the holder's files
	out  logbuf.Buffer // its stderr, read while it runs
	done chan struct{}
}

// stderrKept is how much of a process's output a step keeps for its
// error messages.
const stderrKept = 64 << 10

// newProc is a process of the step whose files are in dir, not started.
func newProc(dir string) *proc {
	return &proc{dir: dir, out: logbuf.Buffer{Limit: stderrKept}, done: make(chan struct{})}
}

// tail is the kept output, for an error message.
func tail(b *logbuf.Buffer) string { return strings.TrimSpace(b.String()) }

// start starts argv in pod p; done closes when it exited.
func (r *run) start(ctx context.Context, p *netlab.Pod, dir string, argv ...string) (*proc, error) {
	pr := newProc(dir)
	pr.cmd = p.Cmd(ctx, argv[0], argv[1:]...)
	pr.cmd.Stderr = &pr.out
	if err := r.wl.Start(p, pr.cmd); err != nil {
		return nil, err
	}
	go func() { pr.cmd.Wait(); close(pr.done) }()
	return pr, nil
}

func signalAll(ps []*proc, sig syscall.Signal) {
	for _, p := range ps {
		p.cmd.Process.Signal(sig)
	}
}

// waitFiles waits until every process wrote name in its directory. A
// process that exits first fails it at once, with its stderr.
func waitFiles(ctx context.Context, ps []*proc, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	left := append([]*proc(nil), ps...)
	for len(left) > 0 {
		rest := left[:0]
		for _, p := range left {
			if _, err := os.Stat(filepath.Join(p.dir, name)); err == nil {
				continue
			}
			select {
			case <-p.done:
				return fmt.Errorf("%s exited before it wrote %s: %s", p.cmd.Args[len(p.cmd.Args)-1], name, tail(&p.out))
			default:
			}
			rest = append(rest, p)
		}
		left = rest
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d of %d processes had not written %s after %s", errTooSlow, len(left), len(ps), name, timeout)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

var (
	errTooSlow   = errors.New("too slow")
	errLowMemory = errors.New("MemAvailable too low")
)

// watchMemory cancels ctx with errLowMemory when MemAvailable falls under
// floor; low is the lowest it saw.
func watchMemory(ctx context.Context, cancel context.CancelCauseFunc, floor uint64) (low func() uint64) {
	var mu sync.Mutex
	lowest := uint64(1 << 63)
	go func() {
		for ctx.Err() == nil {
			if avail, err := bench.MemAvailable(); err == nil {
				mu.Lock()
				lowest = min(lowest, avail)
				mu.Unlock()
				if avail < floor {
					cancel(fmt.Errorf("%w: %.1f GiB, under the floor of %.1f GiB", errLowMemory, gib(avail), gib(floor)))
					return
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { mu.Lock(); defer mu.Unlock(); return lowest }
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

// agent is a step's `eztunnel run`.
type agent struct {
	*proc
	cfg     datapath.Config
	metrics string // host:port of /metrics
	// before: the programs loaded before it started (not its own).
	before map[ebpf.ProgramID]bool
}

// startAgent starts an agent with maps sized for the step. Its pins are
// recorded with the lab; stop removes them.
func (r *run) startAgent(ctx context.Context, row *Row, plan Plan) (*agent, func(), error) {
	ag := &agent{proc: newProc(filepath.Join(r.tmp, "agent-"+strconv.Itoa(plan.Conns))), cfg: datapath.DefaultConfig()}
	ag.cfg.PinRoot = "/sys/fs/bpf/ezbench-scale"
	if _, err := os.Stat(ag.cfg.Dir()); err == nil {
		datapath.Uninstall(ag.cfg, 0)
	}
	undoPin, err := r.lab.Record(netlab.RecPin, ag.cfg.PinRoot)
	if err != nil {
		return nil, nil, err
	}
	// Two sockhash entries a connection (the probe's too); pairs in setup
	// at once: the holders' parallel connects, twice over.
	row.MaxSockets = max(ag.cfg.MaxSockets, r.o.MaxSockets, uint32(2*plan.Conns+4096))
	row.MaxPairs = max(ag.cfg.MaxPairs, uint32(2*plan.Procs()*plan.PerHolder(r.o.Parallel)))
	if ag.metrics, err = freePort(); err != nil {
		undoPin()
		return nil, nil, err
	}
	if err := os.MkdirAll(ag.dir, 0o755); err != nil {
		undoPin()
		return nil, nil, err
	}
	ready := filepath.Join(ag.dir, "ready")
	ag.cmd = sysexec.Command(ctx, r.o.Agent, "run", "--cgroup", r.lab.Managed, "--pin-path", ag.cfg.PinRoot,
		"--ready-file", ready, "--metrics-addr", ag.metrics,
		"--max-sockets", strconv.FormatUint(uint64(row.MaxSockets), 10), "--max-pairs", strconv.FormatUint(uint64(row.MaxPairs), 10),
		"--exclude-ports", strconv.Itoa(probePlainPort))
	ag.cmd.Stderr = &ag.out
	// A killed bench takes its agent along; the next run's sweep undoes
	// its pins (recorded above).
	ag.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stop := func() {
		ag.stopAgent()
		datapath.Uninstall(ag.cfg, 10*time.Second)
		undoPin()
	}
	if ag.before, err = bench.ProgramIDs(); err != nil {
		undoPin()
		return nil, nil, err
	}
	if err := ag.cmd.Start(); err != nil {
		undoPin()
		return nil, nil, err
	}
	go func() { ag.cmd.Wait(); close(ag.done) }()
	if err := workload.WaitReady(ctx, ready, time.Minute, ag.done); err != nil {
		stop()
		return nil, nil, fmt.Errorf("%w: agent with --max-sockets %d --max-pairs %d: %w: %s", errAgent, row.MaxSockets, row.MaxPairs, err, tail(&ag.out))
	}
	return ag, stop, nil
}

var errAgent = errors.New("map size")

// stopAgent stops the agent (SIGTERM; SIGKILL after 30 s): the datapath
// stays pinned.
func (a *agent) stopAgent() {
	if a.cmd.Process == nil {
		return
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		a.cmd.Process.Kill()
		<-a.done
	}
}
