// Package scope measures the two ways Kubernetes mode could select pods: a
// link pair (ez_sc_egress, ez_sc_sockops) attached and pinned per pod cgroup, or
// one attachment at the pods' root and a cgroup id per pod in ez_sc_cgroups
// (what the agent does). Both run on the real kernel against N throwaway pod
// cgroups (each with a container child, as the kubelet makes them).
package scope

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// Options of Run.
type Options struct {
	Pods   int
	Rounds int
	Log    io.Writer
}

// Run creates the cgroups, measures both models Rounds times and prints a table.
func Run(o Options, out io.Writer) (err error) {
	if o.Pods < 1 || o.Pods > datapathMaxScope() {
		return fmt.Errorf("--pods %d out of range [1, %d]", o.Pods, datapathMaxScope())
	}
	if o.Rounds < 1 {
		return fmt.Errorf("--rounds %d must be at least 1", o.Rounds)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return err
	}
	cg2, err := cgroupv2.Root()
	if err != nil {
		return err
	}
	root := filepath.Join(cg2, "eztunnel-scopebench-"+strconv.Itoa(os.Getpid()))
	pods := make([]string, o.Pods+1) // the last one is the pod added to a full node
	defer func() {
		for _, p := range pods {
			if p != "" {
				os.Remove(filepath.Join(p, "ctr"))
				os.Remove(p)
			}
		}
		os.Remove(root)
	}()
	if err := os.Mkdir(root, 0o755); err != nil {
		return err
	}
	ids := make([]uint64, len(pods))
	for i := range pods {
		p := filepath.Join(root, fmt.Sprintf("pod%04d", i))
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		pods[i] = p
		if err := os.Mkdir(filepath.Join(p, "ctr"), 0o755); err != nil {
			return err
		}
		if ids[i], err = cgroupv2.ID(p); err != nil {
			return err
		}
	}
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = "/sys/fs/bpf/eztunnel-scopebench"
	if _, err := os.Stat(cfg.PinRoot); err == nil {
		return fmt.Errorf("%s exists: another scope benchmark runs, or a killed one left it (eztunnel uninstall --pin-path %s)", cfg.PinRoot, cfg.PinRoot)
	}
	cfg.CgroupFilter = true
	dp, err := datapath.Install(cfg, []string{root})
	if err != nil {
		return err
	}
	defer func() {
		dp.Close()
		if uerr := datapath.Uninstall(cfg, 5*time.Second); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()

	n := o.Pods
	var rows [][6]time.Duration // per round: links attach, links +1, links detach, map set, map +1, map clear
	for r := 0; r < o.Rounds; r++ {
		var row [6]time.Duration
		// Per-pod links (the root keeps its own links in both models).
		perPod := append([]string{root}, pods[:n]...)
		t0 := time.Now()
		if _, _, _, err := dp.ReconcileCgroups(perPod); err != nil {
			return err
		}
		row[0] = time.Since(t0)
		t0 = time.Now()
		if _, _, _, err := dp.ReconcileCgroups(append(perPod, pods[n])); err != nil {
			return err
		}
		row[1] = time.Since(t0)
		t0 = time.Now()
		if _, _, _, err := dp.ReconcileCgroups([]string{root}); err != nil {
			return err
		}
		row[2] = time.Since(t0)
		// One attachment, a map entry per pod.
		t0 = time.Now()
		if _, _, err := dp.SetScope(ids[:n]); err != nil {
			return err
		}
		row[3] = time.Since(t0)
		t0 = time.Now()
		if _, _, err := dp.SetScope(ids); err != nil {
			return err
		}
		row[4] = time.Since(t0)
		t0 = time.Now()
		if _, _, err := dp.SetScope(nil); err != nil {
			return err
		}
		row[5] = time.Since(t0)
		rows = append(rows, row)
		if o.Log != nil {
			fmt.Fprintf(o.Log, "round %d/%d done\n", r+1, o.Rounds)
		}
	}
	fmt.Fprintf(out, "Selecting %d pods (kernel %s), %d rounds; milliseconds per operation, median [min, max]\n\n", n, kernelRelease(), o.Rounds)
	fmt.Fprintf(out, "| model | select %d pods | add pod %d | deselect all |\n|---|---|---|---|\n", n, n+1)
	fmt.Fprintf(out, "| link pair per pod (%d links, %d pins) | %s | %s | %s |\n", 2*n, 2*n, cell(rows, 0), cell(rows, 1), cell(rows, 2))
	fmt.Fprintf(out, "| one attachment + ez_sc_cgroups entry per pod | %s | %s | %s |\n", cell(rows, 3), cell(rows, 4), cell(rows, 5))
	return nil
}

func datapathMaxScope() int { return 4000 }

func cell(rows [][6]time.Duration, col int) string {
	v := make([]float64, len(rows))
	for i, r := range rows {
		v[i] = float64(r[col].Microseconds()) / 1000
	}
	for i := 1; i < len(v); i++ {
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
	return fmt.Sprintf("%.2f [%.2f, %.2f]", v[len(v)/2], v[0], v[len(v)-1])
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return string(b[:len(b)-1])
}
