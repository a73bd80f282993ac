package quick

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// EarlyDataOptions configures `eztunnel-lab bench early-data`.
type EarlyDataOptions struct {
	Conns int
	Exe   string
	Log   io.Writer
}

// EarlyDataRow is one placement's outcome.
type EarlyDataRow struct {
	Scenario  string `json:"scenario"`
	Conns     int    `json:"conns"`
	Pairs     uint64 `json:"pairs"`
	EarlyData uint64 `json:"fallback_early_data"`
	Other     uint64 `json:"other_fallbacks"`
}

// EarlyData measures how often a client that writes right after connect()
// settles for the kernel path because its server socket was not
// established yet (counter fallback_early_data): o.Conns connections one
// after the other, with client and server on one CPU, unpinned, and
// unpinned next to a CPU hog (stress-ng --cpu 2); pod to pod over the
// bridge, and over loopback inside one pod (the app-to-sidecar hop).
func EarlyData(ctx context.Context, o EarlyDataOptions, stdout io.Writer) (err error) {
	if o.Conns < 1 {
		return fmt.Errorf("--conns %d must be at least 1", o.Conns)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if _, err := exec.LookPath("stress-ng"); err != nil {
		return errors.New("stress-ng is not installed (scripts/install-deps.sh installs it)")
	}
	if err := bench.Preflight(); err != nil {
		return err
	}
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = "/sys/fs/bpf/ezbench-early"
	if err := bench.Sweep(cfg, o.Log); err != nil {
		return fmt.Errorf("remove leftovers of an earlier run: %w", err)
	}
	lab, err := netlab.New("early", 32)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, lab.Close()) }()
	a, err := lab.AddPod("a", true)
	if err != nil {
		return err
	}
	b, err := lab.AddPod("b", true)
	if err != nil {
		return err
	}
	dp, err := datapath.Install(cfg, []string{lab.Managed})
	if err != nil {
		return fmt.Errorf("install datapath: %w", err)
	}
	defer func() {
		dp.Close()
		err = errors.Join(err, datapath.Uninstall(cfg, bench.Drain))
	}()
	last := runtime.NumCPU() - 1
	scenarios := []struct {
		name     string
		cpus     []int
		hog      bool
		loopback bool // client in the server's pod, over lo (a sidecar's hop)
	}{
		{fmt.Sprintf("pod to pod, pinned (client and server on CPU %d)", last), []int{last}, false, false},
		{"pod to pod, unpinned", nil, false, false},
		{"pod to pod, unpinned, stress-ng --cpu 2 running", nil, true, false},
		{fmt.Sprintf("loopback in one pod, pinned (CPU %d)", last), []int{last}, false, true},
		{"loopback in one pod, unpinned, stress-ng --cpu 2 running", nil, true, true},
	}
	var rows []EarlyDataRow
	for _, sc := range scenarios {
		wl := workload.Client{Exe: o.Exe, Placement: workload.Placement{CPUs: sc.cpus}}
		fmt.Fprintf(o.Log, "%s: %d connections\n", sc.name, o.Conns)
		client, addr := a, net.JoinHostPort(b.IPv4.String(), "7001")
		if sc.loopback {
			client, addr = b, "127.0.0.1:7001"
		}
		row, err := earlyRun(ctx, o, dp, wl, client, b, addr, sc.hog)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		row.Scenario = sc.name
		rows = append(rows, row)
	}
	var sb strings.Builder
	var table [][]string
	for _, r := range rows {
		table = append(table, []string{r.Scenario, strconv.Itoa(r.Conns), strconv.FormatUint(r.Pairs, 10),
			strconv.FormatUint(r.EarlyData, 10), fmt.Sprintf("%.1f%%", 100*float64(r.EarlyData)/float64(r.Conns)),
			strconv.FormatUint(r.Other, 10)})
	}
	bench.WriteTable(&sb, []string{"placement", "connections", "paired", "fallback_early_data", "early data", "other fallbacks"}, table)
	_, err = io.WriteString(stdout, "\nclients writing right after connect(): how many settled for the kernel path\n\n"+sb.String())
	return err
}

func earlyRun(ctx context.Context, o EarlyDataOptions, dp *datapath.Datapath, wl workload.Client, a, b *netlab.Pod, addr string, hog bool) (EarlyDataRow, error) {
	row := EarlyDataRow{Conns: o.Conns}
	srv, err := wl.Serve(ctx, b, "", "--echo", ":7001")
	if err != nil {
		return row, err
	}
	defer srv.Stop()
	if hog {
		stop, err := startHog(ctx)
		if err != nil {
			return row, err
		}
		defer stop()
	}
	before, err := dp.Counters()
	if err != nil {
		return row, err
	}
	var res workload.EarlyResult
	if _, err := wl.Workload(ctx, a, 5*time.Minute, &res, "early", "--addr", addr,
		"--conns", strconv.Itoa(o.Conns)); err != nil {
		return row, err
	}
	after, err := dp.Counters()
	if err != nil {
		return row, err
	}
	d := bench.Delta(before, after)
	row.Pairs, row.EarlyData = d["pairs"], d["fallback_early_data"]
	for k, v := range d {
		if strings.HasPrefix(k, "fallback_") && k != "fallback_early_data" {
			row.Other += v
		}
	}
	return row, nil
}

// startHog runs stress-ng --cpu 2 until stop is called.
func startHog(ctx context.Context) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd := sysexec.Command(ctx, "stress-ng", "--cpu", "2", "--quiet")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) } // its workers too
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("stress-ng: %w", err)
	}
	time.Sleep(500 * time.Millisecond) // let the workers spin up
	return func() { cancel(); cmd.Wait() }, nil
}
