package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestTasksThread reads this thread's schedstat before and after it ran and
// slept: the deltas count the CPU it used and the timeslice it woke into.
func TestTasksThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	th := Thread(unix.Gettid())
	s0, err := th.Snap()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 10_000_000 {
		x += i
	}
	unix.Nanosleep(&unix.Timespec{Nsec: 1_000_000}, nil) // blocks: the wake-up is a new timeslice
	s1, err := th.Snap()
	if err != nil {
		t.Fatal(err)
	}
	d := s1.Since(s0)
	if d.CPU <= 0 || d.Slices < 1 || d.Wait < 0 {
		t.Errorf("after a busy loop (%d) and a sleep: %+v", x, d)
	}
	if got, want := d.Add(s0.Since(nil)), s1.Since(nil); got != want {
		t.Errorf("Add(Since) = %+v, want %+v", got, want)
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
	if _, err := s.Snap(); err != nil {
		t.Fatal(err)
	}
}

// TestCgroupTasks lists a cgroup's threads again at each snapshot: a
// thread started after the first counts whole in the difference.
func TestCgroupTasks(t *testing.T) {
	root, err := cgroupv2.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, "ez-tasks-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	sleeper := func() *exec.Cmd {
		// A shell that blocks reading a pipe this test holds open.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := sysexec.Command(context.Background(), "sh", "-c", "read x")
		cmd.Stdin = pr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pr.Close()
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); pw.Close() })
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	sleeper()
	tk, err := CgroupTasks(dir)
	if err != nil {
		t.Fatal(err)
	}
	s0, err := tk.Snap()
	if err != nil || len(s0) != 1 {
		t.Fatalf("one process: %v %v", s0, err)
	}
	second := sleeper()
	s1, err := tk.Snap()
	if err != nil || len(s1) != 2 {
		t.Fatalf("two processes: %v %v", s1, err)
	}
	f := "/proc/" + strconv.Itoa(second.Process.Pid) + "/schedstat"
	if d := s1.Since(s0); d.Slices < s1[f].Slices {
		t.Errorf("the new thread did not count whole: %+v, its own %+v", d, s1[f])
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

// TestProcessTasks: this process's threads, listed at each Snap, include
// the calling thread, and their total CPU time grows with a busy loop; a
// process that does not exist is an error naming it.
func TestProcessTasks(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p := ProcessTasks(os.Getpid())
	s0, err := p.Snap()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s0["/proc/"+strconv.Itoa(os.Getpid())+"/task/"+strconv.Itoa(unix.Gettid())+"/schedstat"]; !ok {
		t.Errorf("the calling thread is not among %d tasks", len(s0))
	}
	x := 0
	for i := range 10_000_000 {
		x += i
	}
	s1, err := p.Snap()
	if err != nil {
		t.Fatal(err)
	}
	if d := s1.Total().CPU - s0.Total().CPU; d <= 0 {
		t.Errorf("after a busy loop (%d) the process's CPU time grew by %s", x, d)
	}
	if _, err := ProcessTasks(1 << 30).Snap(); err == nil || !strings.Contains(err.Error(), strconv.Itoa(1<<30)) {
		t.Errorf("a process that does not exist: %v, want an error naming it", err)
	}
}
