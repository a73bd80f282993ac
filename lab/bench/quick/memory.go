package quick

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
	"github.com/prometheus/procfs"
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
}

// Memory runs the agent as `eztunnel run` on a lab node and reports its RSS
// and the memory of its BPF maps idle and with o.Conns established
// accelerated connections.
func Memory(ctx context.Context, o MemoryOptions, stdout io.Writer) (err error) {
	if o.Conns < 1 {
		return fmt.Errorf("--conns %d must be at least 1", o.Conns)
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
	agent := sysexec.Command(ctx, o.Agent, "run", "--cgroup", lab.Managed, "--pin-path", cfg.PinRoot, "--ready-file", agentReady)
	agent.Stderr = o.Log
	if err := agent.Start(); err != nil {
		return err
	}
	defer agent.Wait()
	if err := workload.WaitReady(ctx, agentReady, 20*time.Second, nil); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	idle, err := sampleMemory(agent.Process.Pid, cfg, 0)
	if err != nil {
		return err
	}

	wl := workload.Client{Exe: o.Exe}
	srv, err := wl.Serve(ctx, b, tmp, "--stream", ":7000")
	if err != nil {
		return err
	}
	defer srv.Stop()
	holdReady := filepath.Join(tmp, "hold")
	fmt.Fprintf(o.Log, "opening %d connections\n", o.Conns)
	hold := a.Cmd(ctx, o.Exe, "workload", "hold", "--addr", net.JoinHostPort(b.IPv4.String(), "7000"),
		"--conns", strconv.Itoa(o.Conns), "--ready-file", holdReady)
	hold.Stderr = o.Log
	if err := a.Start(hold); err != nil {
		return err
	}
	defer hold.Wait()
	if err := workload.WaitReady(ctx, holdReady, 5*time.Minute, nil); err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	time.Sleep(time.Second) // let the server's side settle
	loaded, err := sampleMemory(agent.Process.Pid, cfg, o.Conns)
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

func sampleMemory(pid int, cfg datapath.Config, conns int) (MemorySample, error) {
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
	if s.AgentRSS, err = procRSS(pid); err != nil {
		return s, err
	}
	mem, err := bench.ProcessBPFMemory(pid)
	s.MapMemlock, s.ProgMemlock = mem.Maps, mem.Programs
	return s, err
}

// procRSS is the resident set of a process in bytes (procfs).
func procRSS(pid int) (uint64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return uint64(st.ResidentMemory()), nil
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
	total := loaded.total()
	verdict := "PASS"
	if total >= 25<<20 {
		verdict = "MISS"
	}
	fmt.Fprintf(w, "\ntarget: agent RSS + BPF map and program memory under 25 MB with %d connections: %s MB, %s\n", loaded.Conns, mb(total), verdict)
}

func (s MemorySample) total() uint64 { return s.AgentRSS + s.MapMemlock + s.ProgMemlock }
