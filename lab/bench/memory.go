package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/netlab"
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
	Conns      int    `json:"conns"`
	Pairs      uint64 `json:"pairs"`
	AgentRSS   uint64 `json:"agent_rss_bytes"`
	MapMemlock uint64 `json:"bpf_map_bytes"` // memlock of every BPF map the agent holds (fdinfo)
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
	defer func() {
		if uerr := datapath.Uninstall(cfg, 10*time.Second); uerr != nil && !errors.Is(uerr, datapath.ErrNotInstalled) && err == nil {
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
	if err := waitReady(ctx, agentReady, 20*time.Second); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	idle, err := sampleMemory(agent.Process.Pid, cfg, 0)
	if err != nil {
		return err
	}

	srvReady := filepath.Join(tmp, "server")
	srv := b.Cmd(ctx, o.Exe, "workload", "serve", "--stream", ":7000", "--ready-file", srvReady)
	srv.Stderr = o.Log
	if err := b.Start(srv); err != nil {
		return err
	}
	defer srv.Wait()
	if err := waitReady(ctx, srvReady, 10*time.Second); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	holdReady := filepath.Join(tmp, "hold")
	fmt.Fprintf(o.Log, "opening %d connections\n", o.Conns)
	hold := a.Cmd(ctx, o.Exe, "workload", "hold", "--addr", net.JoinHostPort(b.IPv4.String(), "7000"),
		"--conns", strconv.Itoa(o.Conns), "--ready-file", holdReady)
	hold.Stderr = o.Log
	if err := a.Start(hold); err != nil {
		return err
	}
	defer hold.Wait()
	if err := waitReady(ctx, holdReady, 5*time.Minute); err != nil {
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

func waitReady(ctx context.Context, path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
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
	s.MapMemlock, err = mapMemlock(pid)
	return s, err
}

// procRSS reads VmRSS of a process, in bytes.
func procRSS(pid int) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// mapMemlock sums the memlock of every distinct BPF map the process holds
// an fd of, as its fdinfo reports it.
func mapMemlock(pid int) (uint64, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	var total uint64
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(dir, fd.Name()))
		if err != nil || target != "anon_inode:bpf-map" {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		var id string
		var memlock uint64
		for _, line := range strings.Split(string(info), "\n") {
			k, v, _ := strings.Cut(line, ":")
			switch k {
			case "map_id":
				id = strings.TrimSpace(v)
			case "memlock":
				memlock, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			}
		}
		if id != "" && !seen[id] {
			seen[id] = true
			total += memlock
		}
	}
	return total, nil
}

func printMemory(w io.Writer, idle, loaded MemorySample) {
	mb := func(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "connections\tpairs\tagent RSS (MB)\tBPF maps (MB)\ttotal (MB)\t")
	for _, s := range []MemorySample{idle, loaded} {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t\n", s.Conns, s.Pairs, mb(s.AgentRSS), mb(s.MapMemlock), mb(s.AgentRSS+s.MapMemlock))
	}
	tw.Flush()
	total := loaded.AgentRSS + loaded.MapMemlock
	verdict := "PASS"
	if total >= 25<<20 {
		verdict = "MISS"
	}
	fmt.Fprintf(w, "\ntarget: agent RSS + BPF map memory under 25 MB with %d connections: %s MB, %s\n", loaded.Conns, mb(total), verdict)
}
