package mesh

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// systemBusy returns the busy CPU seconds of all CPUs since boot: every
// /proc/stat "cpu" column except idle and iowait (softirq included: that
// is where the kernel's network stack runs).
func systemBusy(fs procfs.FS) (float64, error) {
	st, err := fs.Stat()
	if err != nil {
		return 0, err
	}
	return busy(st.CPUTotal), nil
}

func busy(c procfs.CPUStat) float64 {
	// Guest time is already counted in user.
	return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
}

type procTime struct {
	name    string
	seconds float64
}

// procTimes returns utime+stime in seconds of every process in the cgroup
// tree, keyed by pid, with its name.
func procTimes(pfs procfs.FS, cgroup string) map[int]procTime {
	out := map[int]procTime{}
	filepath.WalkDir(cgroup, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		for _, s := range bytes.Fields(b) {
			pid, _ := strconv.Atoi(string(s))
			p, err := pfs.Proc(pid)
			if err != nil {
				continue
			}
			if st, err := p.Stat(); err == nil {
				out[pid] = procTime{name: st.Comm, seconds: st.CPUTime()}
			}
		}
		return nil
	})
	return out
}

// procDelta sums, by process name, the CPU seconds processes alive at both
// snapshots used between them.
func procDelta(before, after map[int]procTime) ProcCPU {
	out := ProcCPU{}
	for pid, a := range after {
		if b, ok := before[pid]; ok && b.name == a.name {
			out[a.name] += a.seconds - b.seconds
		}
	}
	return out
}

// memUsedMB is MemTotal - MemAvailable in MiB: context only, the whole
// machine's memory moves with everything else running on it.
func memUsedMB(pfs procfs.FS) (float64, error) {
	mi, err := pfs.Meminfo()
	if err != nil {
		return 0, err
	}
	if mi.MemTotal == nil || mi.MemAvailable == nil {
		return 0, os.ErrNotExist
	}
	return float64(*mi.MemTotal-*mi.MemAvailable) / 1024, nil
}

// tcpMemPages is the kernel's TCP socket memory in pages (sockstat "TCP:
// mem"): one counter for every network namespace of the machine.
func tcpMemPages(pfs procfs.FS) (int, error) {
	st, err := pfs.NetSockstat()
	if err != nil {
		return 0, err
	}
	for _, p := range st.Protocols {
		if p.Protocol == "TCP" && p.Mem != nil {
			return *p.Mem, nil
		}
	}
	return 0, os.ErrNotExist
}

// sockMemPeak samples tcpMemPages every few milliseconds until stop is
// called, which returns the highest rise over the first sample in MiB.
func sockMemPeak(pfs procfs.FS) (stop func() float64, err error) {
	base, err := tcpMemPages(pfs)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	peak := base
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			if n, err := tcpMemPages(pfs); err == nil {
				mu.Lock()
				peak = max(peak, n)
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(done)
		<-finished
		return float64(peak-base) * float64(os.Getpagesize()) / (1 << 20)
	}, nil
}
