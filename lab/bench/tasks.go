package bench

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Tasks reads what a set of tasks (threads) ran, from /proc/<tid>/schedstat
// (CONFIG_SCHED_INFO, kernel/sched/stats.h): CPU time, time spent runnable
// but waiting on a run queue, and timeslices (each a wake-up, or the
// return from a preemption). On a CPU that runs both ends of a round trip,
// these tell a path that got slower from one that got scheduled
// differently: more timeslices or more wait per round trip with the same
// CPU time.
type Tasks struct {
	files []string
	// cgroup: the threads are those of this cgroup v2 directory and the
	// cgroups under it, listed again at each Snap (a server may start a
	// thread for a connection); a thread may exit between two snapshots.
	cgroup string
	// pid: the threads are those of this process, listed again at each
	// Snap.
	pid int
}

// TaskStat is what Tasks ran.
type TaskStat struct {
	CPU, Wait time.Duration
	Slices    uint64
}

// Sub is s - o.
func (s TaskStat) Sub(o TaskStat) TaskStat {
	return TaskStat{CPU: s.CPU - o.CPU, Wait: s.Wait - o.Wait, Slices: s.Slices - o.Slices}
}

// Add is s + o.
func (s TaskStat) Add(o TaskStat) TaskStat {
	return TaskStat{CPU: s.CPU + o.CPU, Wait: s.Wait + o.Wait, Slices: s.Slices + o.Slices}
}

// OpenSoftirqd finds the softirq threads (ksoftirqd/N). The network receive
// work a CPU could not finish in the interrupted context (__do_softirq
// stops restarting when a task needs the CPU or after 2 ms) is left to
// them, and costs a wake-up and a context switch.
func OpenSoftirqd() (*Tasks, error) {
	comms, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		return nil, err
	}
	t := &Tasks{}
	for _, c := range comms {
		b, err := os.ReadFile(c)
		if err == nil && strings.HasPrefix(string(b), "ksoftirqd/") {
			t.files = append(t.files, filepath.Join(filepath.Dir(c), "schedstat"))
		}
	}
	if len(t.files) == 0 {
		return nil, fmt.Errorf("no ksoftirqd thread in /proc")
	}
	return t, nil
}

// Thread is one thread (a thread ID).
func Thread(tid int) *Tasks {
	return &Tasks{files: []string{"/proc/" + strconv.Itoa(tid) + "/schedstat"}}
}

// CgroupTasks are the threads of cgroup v2 directory dir and of the cgroups
// under it (cgroup.threads), listed at each Snap.
func CgroupTasks(dir string) (*Tasks, error) {
	t := &Tasks{cgroup: dir}
	if _, err := t.list(); err != nil {
		return nil, err
	}
	return t, nil
}

// ProcessTasks are the threads of process pid (/proc/<pid>/task), listed
// at each Snap.
func ProcessTasks(pid int) *Tasks { return &Tasks{pid: pid} }

// dynamic: the tasks are listed at each Snap, so one may exit between the
// listing and its read.
func (t *Tasks) dynamic() bool { return t.cgroup != "" || t.pid != 0 }

func (t *Tasks) list() ([]string, error) {
	if t.pid != 0 {
		files, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(t.pid), "task", "*", "schedstat"))
		if err != nil {
			return nil, err
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("process %d: no threads in /proc", t.pid)
		}
		return files, nil
	}
	if t.cgroup == "" {
		return t.files, nil
	}
	var files []string
	err := filepath.WalkDir(t.cgroup, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.threads"))
		if err != nil {
			return err
		}
		for _, tid := range strings.Fields(string(b)) {
			files = append(files, "/proc/"+tid+"/schedstat")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no thread in cgroup %s", t.cgroup)
	}
	return files, nil
}

// Snapshot is what each task had run at one time, by task.
type Snapshot map[string]TaskStat

// Snap reads every task's schedstat.
func (t *Tasks) Snap() (Snapshot, error) {
	files, err := t.list()
	if err != nil {
		return nil, err
	}
	out := make(Snapshot, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if t.dynamic() && errors.Is(err, fs.ErrNotExist) {
			continue // exited since the listing
		}
		if err != nil {
			return nil, err
		}
		v := strings.Fields(string(b))
		if len(v) < 3 {
			return nil, fmt.Errorf("%s: %q", f, b)
		}
		cpu, err1 := strconv.ParseUint(v[0], 10, 64)
		wait, err2 := strconv.ParseUint(v[1], 10, 64)
		n, err3 := strconv.ParseUint(v[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("%s: %q", f, b)
		}
		out[f] = TaskStat{CPU: time.Duration(cpu), Wait: time.Duration(wait), Slices: n}
	}
	return out, nil
}

// Total is what the tasks of s had run.
func (s Snapshot) Total() TaskStat {
	var d TaskStat
	for _, v := range s {
		d = d.Add(v)
	}
	return d
}

// Since is what the tasks of s ran since old: a task new since old counts
// whole (it started in between), one that exited in between not at all.
func (s Snapshot) Since(old Snapshot) TaskStat {
	var d TaskStat
	for f, v := range s {
		d = d.Add(v.Sub(old[f]))
	}
	return d
}
