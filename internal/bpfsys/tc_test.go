package bpfsys

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// A legacy tc filter (the path of kernels without tcx): attached and
// recorded, its program replaced in place (one filter, the new program),
// found by its record and detached with it, the clsact qdisc left.
func TestLegacyTCFilter(t *testing.T) {
	const dir = "/sys/fs/bpf/eztunnel-bpfsys-tctest"
	os.RemoveAll(dir) // left by a killed run
	// EnsureDir: on a host booted without a bpffs at /sys/fs/bpf (CI's) it
	// mounts one, as the agent does.
	if err := EnsureDir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	inFreshNetNS(t, func() {
		var progs [2]*ebpf.Program
		for i := range progs {
			p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
				Name: "ez_test", Type: ebpf.SchedCLS, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}, // TCX_NEXT
			})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			progs[i] = p
		}
		cookie, err := NetNSCookie("")
		if err != nil {
			t.Fatal(err)
		}
		f := TCFilter{Ifindex: 1, Name: "ez_test", Prio: 1}
		filters := func() []*netlink.BpfFilter {
			lo, err := netlink.LinkByIndex(1)
			if err != nil {
				t.Fatal(err)
			}
			fs, err := netlink.FilterList(lo, netlink.HANDLE_MIN_EGRESS)
			if err != nil {
				return nil
			}
			var out []*netlink.BpfFilter
			for _, x := range fs {
				if b, ok := x.(*netlink.BpfFilter); ok {
					out = append(out, b)
				}
			}
			return out
		}
		for i, p := range progs {
			if err := AttachTCFilter(dir, cookie, f, p); err != nil {
				t.Fatalf("attach %d: %v", i, err)
			}
			info, err := p.Info()
			if err != nil {
				t.Fatal(err)
			}
			id, _ := info.ID()
			fs := filters()
			if len(fs) != 1 || ebpf.ProgramID(fs[0].Id) != id || fs[0].Name != f.Name || fs[0].Priority != f.Prio || !fs[0].DirectAction {
				t.Fatalf("after attach %d: filters %+v, want one running program %d", i, fs, id)
			}
		}
		recs, err := TCRecords(dir)
		if err != nil || len(recs) != 1 || recs[0] != TCRecord(dir, cookie, f) {
			t.Fatalf("records %v (%v), want %s", recs, err, TCRecord(dir, cookie, f))
		}
		if c, g, err := ParseTCRecord(recs[0]); err != nil || c != cookie || g.Ifindex != 1 || g.Ingress || g.Name != f.Name {
			t.Fatalf("parse %s: %d %+v %v", recs[0], c, g, err)
		}
		if err := DetachTCFilters(dir); err != nil {
			t.Fatal(err)
		}
		if fs := filters(); len(fs) != 0 {
			t.Errorf("after detach: %+v", fs)
		}
		lo, _ := netlink.LinkByIndex(1)
		qs, err := netlink.QdiscList(lo)
		if err != nil || len(qs) != 1 || qs[0].Type() != clsactKind {
			t.Errorf("after detach: qdiscs %v (%v), want the clsact left, empty", qs, err)
		}
		if _, err := os.Stat(filepath.Join(dir, TCDir)); !os.IsNotExist(err) {
			t.Errorf("records left: %v", err)
		}
	})
}

// TestTCAttachableKeepsThreads: the legacy tc trial gives its thread back
// (network namespace restored, unlocked) rather than ending it. An ended
// thread SIGKILLs the children it forked with Pdeathsig (golang/go#27505):
// the lab's and the tests' servers died that way on Linux 6.1, seen as
// "connection refused". Children forked from many threads must outlive 20
// trials, and no thread of the process may end.
func TestTCAttachableKeepsThreads(t *testing.T) {
	t.Setenv(tcTestEnv, "1") // the trial runs on kernels with tcx too
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "ez_test", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	var children []*exec.Cmd
	defer func() {
		for _, c := range children {
			c.Process.Kill()
			c.Wait()
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			c := sysexec.Command(context.Background(), "sh", "-c", "sleep 120")
			c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := c.Start(); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			children = append(children, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	before := tasks(t)
	for range 20 {
		if err := TCAttachable(prog); err != nil {
			t.Fatal(err)
		}
	}
	after := tasks(t)
	for tid := range before {
		if !after[tid] {
			t.Errorf("thread %d ended during the trials", tid)
		}
	}
	time.Sleep(100 * time.Millisecond)
	for _, c := range children {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Errorf("child %d, forked with Pdeathsig, died: %v", c.Process.Pid, err)
			continue
		}
		var ws syscall.WaitStatus
		if pid, _ := syscall.Wait4(c.Process.Pid, &ws, syscall.WNOHANG, nil); pid == c.Process.Pid {
			t.Errorf("child %d, forked with Pdeathsig, died: %v", pid, ws)
		}
	}
}

// tasks is the set of this process's thread ids.
func tasks(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			out[tid] = true
		}
	}
	return out
}
