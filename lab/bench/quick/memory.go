package quick

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// MemoryOptions configures `eztunnel bench memory`.
type MemoryOptions struct {
	Exe   string // the eztunnel-lab binary: workloads
	Agent string // the eztunnel agent binary
	Conns int
	Log   io.Writer
}

// MemorySample is the agent's memory at one moment.
type MemorySample struct {
	Conns       int    `json:"conns"`
	Pairs       uint64 `json:"pairs"`
	AgentRSS    uint64 `json:"agent_rss_bytes"`
	MapMemlock  uint64 `json:"bpf_map_bytes"`  // MapInfo.Memlock of every BPF map the agent holds
	ProgMemlock uint64 `json:"bpf_prog_bytes"` // ProgramInfo.Memlock of its BPF programs
	// MapBytes: MapMemlock by map (the kernel's name: 15 characters).
	MapBytes map[string]uint64 `json:"bpf_map_bytes_by_map"`
}

// Memory runs the agent as `eztunnel run` on a lab node and reports its RSS
// and the memory of its BPF maps idle and with o.Conns established
// accelerated connections.
func Memory(ctx context.Context, o MemoryOptions, stdout io.Writer) (err error) {
	if o.Conns < 1 {
		return fmt.Errorf("--conns %d must be at least 1", o.Conns)
	}
	if o.Conns > maxHeldConns {
		return fmt.Errorf("--conns %d: one client address to one server port holds at most %d connections (the ephemeral ports 1024-65535)", o.Conns, maxHeldConns)
	}
	// Every process of the run (the agent, the server, the holder)
	// inherits this process's limit: each needs a descriptor per connection.
	if got, err := bench.RaiseNofile(uint64(o.Conns) + 256); err != nil {
		return fmt.Errorf("--conns %d: %w", o.Conns, err)
	} else if got < uint64(o.Conns)+256 {
		return fmt.Errorf("--conns %d: needs %d open files per process, RLIMIT_NOFILE allows %d (raising the hard limit needs CAP_SYS_RESOURCE; bench scale spreads connections over processes)", o.Conns, o.Conns+256, got)
	}
	if err := netlab.Sweep(); err != nil {
		fmt.Fprintln(o.Log, "sweeping leftovers:", err)
	}
	lab, err := netlab.New("mem", 31)
	if err != nil {
		return err
	}
	defer lab.Close()
	a, err := lab.AddPod("a", true)
	if err != nil {
		return err
	}
	b, err := lab.AddPod("b", true)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "ezmem-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = "/sys/fs/bpf/ezbench-mem"
	if _, err := os.Stat(cfg.Dir()); err == nil {
		datapath.Uninstall(cfg, 0)
	}
	// Recorded with the lab, so a killed run's pins and the agent's lock
	// file are swept too; undone after the uninstall (the lock file stays
	// otherwise: only an agent uninstalling on removal deletes its own).
	undoPin, err := lab.Record(netlab.RecPin, cfg.PinRoot)
	if err != nil {
		return err
	}
	defer func() {
		if uerr := datapath.Uninstall(cfg, 10*time.Second); uerr != nil && !errors.Is(uerr, datapath.ErrNotInstalled) && err == nil {
			err = uerr
		}
		if uerr := undoPin(); uerr != nil && err == nil {
			err = uerr
		}
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	agentReady := filepath.Join(tmp, "agent")
	// Two sockhash entries per connection; the default holds 65,536.
	maxSockets := max(cfg.MaxSockets, uint32(2*o.Conns+1024))
	agent := sysexec.Command(ctx, o.Agent, "run", "--cgroup", lab.Managed, "--pin-path", cfg.PinRoot, "--ready-file", agentReady,
		"--max-sockets", strconv.Itoa(int(maxSockets)))
	agent.Stderr = o.Log
	if err := agent.Start(); err != nil {
		return err
	}
	defer agent.Wait()
	if err := workload.WaitReady(ctx, agentReady, 20*time.Second, nil); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	idle, err := SampleMemory(agent.Process.Pid, cfg, 0)
	if err != nil {
		return err
	}

	wl := workload.Client{Exe: o.Exe}
	srv, err := wl.Serve(ctx, b, tmp, "--stream", ":7000")
	if err != nil {
		return err
	}
	defer srv.Stop()
	// The client's ephemeral ports: all of them for one server port.
	if err := a.Sysctl("net.ipv4.ip_local_port_range", "1024 65535"); err != nil {
		return err
	}
	holdReady := filepath.Join(tmp, "hold")
	fmt.Fprintf(o.Log, "opening %d connections\n", o.Conns)
	hold := a.Cmd(ctx, o.Exe, "workload", "hold", "--addr", net.JoinHostPort(b.IPv4.String(), "7000"),
		"--conns", strconv.Itoa(o.Conns), "--ready-file", holdReady)
	hold.Stderr = o.Log
	if err := a.Start(hold); err != nil {
		return err
	}
	held := make(chan struct{})
	go func() { hold.Wait(); close(held) }()
	defer func() { cancel(); <-held }()
	// A holder that fails (a connect refused, out of descriptors) exits:
	// the wait ends then, with its log above, not after the timeout.
	if err := workload.WaitReady(ctx, holdReady, 5*time.Minute, held); err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	time.Sleep(time.Second) // let the server's side settle
	loaded, err := SampleMemory(agent.Process.Pid, cfg, o.Conns)
	if err != nil {
		return err
	}
	cancel()
	printMemory(stdout, idle, loaded)
	if loaded.Pairs < uint64(o.Conns) {
		return fmt.Errorf("only %d of %d connections were accelerated", loaded.Pairs, o.Conns)
	}
	return nil
}

// maxHeldConns is what one client address holds to one server port: the
// ephemeral ports 1024-65535 (the holder's pod is given them all).
const maxHeldConns = 65535 - 1024 + 1

// SampleMemory is the memory of the agent pid (RSS, its BPF maps and programs)
// and the pairs its datapath made, with conns connections held.
func SampleMemory(pid int, cfg datapath.Config, conns int) (MemorySample, error) {
	s := MemorySample{Conns: conns}
	p, err := datapath.OpenPinned(cfg)
	if err != nil {
		return s, err
	}
	defer p.Close()
	c, err := datapath.ReadCounters(p.Counters)
	if err != nil {
		return s, err
	}
	s.Pairs = c["pairs"]
	if s.AgentRSS, err = bench.ProcRSS(pid); err != nil {
		return s, err
	}
	mem, err := bench.ProcessBPFMemory(pid)
	s.MapMemlock, s.ProgMemlock, s.MapBytes = mem.Maps, mem.Programs, mem.MapBytes
	return s, err
}

func printMemory(w io.Writer, idle, loaded MemorySample) {
	mb := func(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	mb2 := func(b uint64) string { return fmt.Sprintf("%.2f", float64(b)/(1<<20)) }
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "connections\tpairs\tagent RSS (MB)\tBPF maps (MB)\tBPF programs (MB)\ttotal (MB)\t")
	for _, s := range []MemorySample{idle, loaded} {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t\n", s.Conns, s.Pairs, mb(s.AgentRSS), mb(s.MapMemlock), mb2(s.ProgMemlock), mb(s.total()))
	}
	tw.Flush()
	// Where the map memory goes: every map of at least 1% of it, largest first.
	names := slices.Collect(maps.Keys(loaded.MapBytes))
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(loaded.MapBytes[b], loaded.MapBytes[a]) })
	fmt.Fprintf(w, "\nBPF maps with %d connections, largest first (MB; idle in brackets):\n", loaded.Conns)
	for _, n := range names {
		if b := loaded.MapBytes[n]; b*100 >= loaded.MapMemlock {
			fmt.Fprintf(w, "  %-16s %6s (%s)\n", n, mb2(b), mb2(idle.MapBytes[n]))
		}
	}
	total := loaded.total()
	verdict := "PASS"
	if total >= 25<<20 {
		verdict = "MISS"
	}
	fmt.Fprintf(w, "\ntarget: agent RSS + BPF map and program memory under 25 MB with %d connections: %s MB, %s\n", loaded.Conns, mb(total), verdict)
}

func (s MemorySample) total() uint64 { return s.AgentRSS + s.MapMemlock + s.ProgMemlock }
