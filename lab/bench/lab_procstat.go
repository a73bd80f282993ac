package bench

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/PID/stat times
// (100 on every Linux architecture eztunnel supports).
const clockTicks = 100

// systemBusy returns the busy CPU seconds of all CPUs since boot: every
// /proc/stat "cpu" column except idle and iowait (softirq included: that
// is where the kernel's network stack runs).
func systemBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseCPULine(line)
}

func parseCPULine(line string) (float64, error) {
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("unexpected /proc/stat line %q", line)
	}
	var busy uint64
	// user nice system idle iowait irq softirq steal (guest is in user).
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, err
		}
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return float64(busy) / clockTicks, nil
}

// procTimes returns utime+stime in seconds of every process in the cgroup
// tree, keyed by pid, with its name.
func procTimes(cgroup string) map[int]procTime {
	out := map[int]procTime{}
	filepath.WalkDir(cgroup, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		for _, s := range bytes.Fields(b) {
			pid, _ := strconv.Atoi(string(s))
			if t, err := readProcTime(pid); err == nil {
				out[pid] = t
			}
		}
		return nil
	})
	return out
}

type procTime struct {
	name    string
	seconds float64
}

// readProcTime parses /proc/PID/stat: comm is in parentheses and may hold
// spaces; utime and stime are fields 14 and 15.
func readProcTime(pid int) (procTime, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procTime{}, err
	}
	return parseProcStat(string(b))
}

func parseProcStat(s string) (procTime, error) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procTime{}, fmt.Errorf("unexpected stat %q", s)
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return procTime{}, fmt.Errorf("short stat %q", s)
	}
	// f[0] is field 3 (state): utime is field 14 = f[11], stime f[12].
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return procTime{}, fmt.Errorf("bad times in stat %q", s)
	}
	return procTime{name: s[open+1 : end], seconds: float64(ut+st) / clockTicks}, nil
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

// memUsedMB is MemTotal - MemAvailable in MiB.
func memUsedMB() (float64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return parseMemUsed(string(b))
}

func parseMemUsed(meminfo string) (float64, error) {
	var total, avail uint64
	for _, line := range strings.Split(meminfo, "\n") {
		k, v, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemTotal":
			total = n
		case "MemAvailable":
			avail = n
		}
	}
	if total == 0 || avail == 0 {
		return 0, fmt.Errorf("no MemTotal/MemAvailable in /proc/meminfo")
	}
	return float64(total-avail) / 1024, nil
}
