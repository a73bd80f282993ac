package mesh

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/prometheus/procfs"
)

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
