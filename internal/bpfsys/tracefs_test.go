package bpfsys

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// TestSyscallEventPrivateTracefs: the id of syscalls:sys_enter_splice comes
// from a private tracefs mount, which the host never sees; a program
// attached with it runs on a splice; the link owns its perf event's fd
// (after a GC, fds opened meanwhile still work) and detaches on Close.
func TestSyscallEventPrivateTracefs(t *testing.T) {
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	id, err := privateTracefs("events/syscalls/sys_enter_splice/id")
	if err != nil {
		t.Fatalf("private tracefs: %v", err)
	}
	if id == 0 {
		t.Fatal("sys_enter_splice's id is 0")
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	hostHas := strings.Contains(string(mounts), " "+tracefsDir+" ")
	if !hostHas {
		// Nothing of the private mount leaks into the process's namespace.
		if _, err := os.Stat(tracefsDir + "/events"); err == nil {
			t.Errorf("%s/events visible outside the private namespace", tracefsDir)
		}
	}
	got, err := TraceEventID("syscalls", "sys_enter_splice")
	if err != nil || got != id {
		t.Fatalf("TraceEventID = %d, %v; want %d (host tracefs mounted: %v)", got, err, id, hostHas)
	}

	counter, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer counter.Close()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.TracePoint, License: "GPL", Instructions: asm.Instructions{
		asm.StoreImm(asm.RFP, -4, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, counter.FD()),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
		asm.Return(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	l, err := AttachTraceEvent("syscalls", "sys_enter_splice", prog)
	if err != nil {
		t.Fatal(err)
	}
	runs := func() uint64 {
		var n uint64
		if err := counter.Lookup(uint32(0), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The perf event's fd has one owner: GC runs no finalizer that closes
	// a number reused by the pipe below.
	runtime.GC()
	runtime.GC()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.GC()
	if _, err := unix.Write(p[1], []byte("x")); err != nil {
		t.Errorf("a pipe opened after the attach broke: %v", err)
	}
	unix.Splice(-1, nil, -1, nil, 1, 0) // EBADF, after the event
	if runs() == 0 {
		t.Error("the program did not run on a splice")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	before := runs()
	// Other processes may splice meanwhile: only this process's splices
	// are known, so check the detach by running a few and allowing none
	// of ours to show (another's would show as well: the counter then
	// rises by theirs only, which this host's tests do not do at once).
	for range 100 {
		unix.Splice(-1, nil, -1, nil, 1, 0)
	}
	if after := runs(); after >= before+100 {
		t.Errorf("the program still runs after Close: %d -> %d", before, after)
	}
	unix.Close(p[0])
	unix.Close(p[1])
}
