package workload

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// A process started with a Placement runs with its CPU affinity and
// niceness from the start; the starting thread gets its own back.
func TestPlacementStart(t *testing.T) {
	cpu := runtime.NumCPU() - 1
	// Locked first, so Start works on this thread and it can be checked.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The child is this test binary, idling in TestPlacementHelper.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := sysexec.Command(context.Background(), exe, "-test.run=^TestPlacementHelper$")
	cmd.Env = append(os.Environ(), "EZ_PLACEMENT_HELPER=1")
	if err := (Placement{CPUs: []int{cpu}, Nice: 5}).Start(cmd.Start); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	p, err := procfs.NewProc(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Stat()
	if err != nil {
		t.Fatal(err)
	}
	status, err := p.NewStatus()
	if err != nil {
		t.Fatal(err)
	}
	if st.Nice != 5 || len(status.CpusAllowedList) != 1 || status.CpusAllowedList[0] != uint64(cpu) {
		t.Errorf("child: nice %d, CPUs %v; want 5, [%d]", st.Nice, status.CpusAllowedList, cpu)
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		t.Fatal(err)
	}
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if set.Count() != runtime.NumCPU() || 20-prio != 0 {
		t.Errorf("starting thread left with %d CPUs, nice %d", set.Count(), 20-prio)
	}
	// A CPU that does not exist: a clear error, nothing started.
	started := false
	if err := (Placement{CPUs: []int{runtime.NumCPU() + 64}}).Start(func() error { started = true; return nil }); err == nil || started {
		t.Errorf("placement on a missing CPU: err %v, started %v", err, started)
	}
}

// TestPlacementHelper is the child of TestPlacementStart: it only waits.
func TestPlacementHelper(t *testing.T) {
	if os.Getenv("EZ_PLACEMENT_HELPER") == "1" {
		time.Sleep(10 * time.Second)
	}
}

func TestParseCPUs(t *testing.T) {
	if got, err := ParseCPUs("0"); err != nil || len(got) != 1 || got[0] != 0 {
		t.Errorf("ParseCPUs(0) = %v, %v", got, err)
	}
	if got, err := ParseCPUs(""); err != nil || got != nil {
		t.Errorf("ParseCPUs(\"\") = %v, %v", got, err)
	}
	for _, bad := range []string{"x", "1-0", "-1", "999"} {
		if _, err := ParseCPUs(bad); err == nil {
			t.Errorf("ParseCPUs(%q) accepted", bad)
		}
	}
}
