package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTasksThread reads this thread's schedstat before and after it ran and
// slept: the deltas count the CPU it used and the timeslice it woke into.
func TestTasksThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	th := Thread(unix.Gettid())
	s0, err := th.Read()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 10_000_000 {
		x += i
	}
	unix.Nanosleep(&unix.Timespec{Nsec: 1_000_000}, nil) // blocks: the wake-up is a new timeslice
	s1, err := th.Read()
	if err != nil {
		t.Fatal(err)
	}
	d := s1.Sub(s0)
	if d.CPU <= 0 || d.Slices < 1 || d.Wait < 0 {
		t.Errorf("after a busy loop (%d) and a sleep: %+v", x, d)
	}
	if got := d.Add(s0); got != s1 {
		t.Errorf("Add(Sub) = %+v, want %+v", got, s1)
	}
}

// TestTasksSoftirqd finds one softirq thread per CPU at least.
func TestTasksSoftirqd(t *testing.T) {
	s, err := OpenSoftirqd()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.files) < runtime.NumCPU() {
		t.Errorf("%d softirq threads for %d CPUs", len(s.files), runtime.NumCPU())
	}
	if _, err := s.Read(); err != nil {
		t.Fatal(err)
	}
}

// TestCgroupTasksBadInput names the cgroup it could not read.
func TestCgroupTasksBadInput(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not-a-cgroup")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := CgroupTasks(dir)
	if err == nil || !strings.Contains(err.Error(), "not-a-cgroup") {
		t.Errorf("CgroupTasks(%s): %v, want an error naming it", dir, err)
	}
}
