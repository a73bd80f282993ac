package bpfsys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/eztunnel/eztunnel/internal/nodelayout"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inFreshNetNS runs fn on a thread in a new network namespace (root needed).
func inFreshNetNS(t *testing.T, fn func()) {
	t.Helper()
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatalf("new netns (root needed): %v", err)
	}
	defer func() {
		ns.Close()
		if err := netns.Set(orig); err != nil {
			t.Errorf("return to the original netns: %v", err) // thread stays locked and dies
			return
		}
		orig.Close()
		runtime.UnlockOSThread()
	}()
	fn()
}

// Two programs at one netfilter hook and priority: the second steps to the
// next free priority in the direction asked.
func TestAttachNetfilterFreePriority(t *testing.T) {
	inFreshNetNS(t, func() {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: ebpf.Netfilter, License: "GPL", AttachType: ebpf.AttachNetfilter,
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer prog.Close()
		opts := link.NetfilterOptions{Program: prog, ProtocolFamily: link.NetfilterProtoIPv4, Hook: link.NetfilterInetPostRouting, Priority: 50}
		var got []int32
		for _, step := range []int32{+1, +1, -1} {
			l, prio, err := AttachNetfilter(opts, step, 4)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got = append(got, prio)
		}
		if want := []int32{50, 51, 49}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Errorf("priorities %v, want %v", got, want)
		}
		// All of 50..51 taken and only two tries: a clear error, not a link.
		if _, _, err := AttachNetfilter(opts, +1, 2); err == nil {
			t.Error("attached with every priority taken")
		}
		if _, _, err := AttachNetfilter(opts, 2, 2); err == nil {
			t.Error("step 2 accepted")
		}
	})
}

// InNetNS runs fn in the named netns and returns the thread to where it was.
func TestInNetNS(t *testing.T) {
	const name = "eztunnel-bpfsys-test"
	netns.DeleteNamed(name) // left by a killed run
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.NewNamed(name) // moves this thread there
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	runtime.UnlockOSThread()
	defer orig.Close()
	defer netns.DeleteNamed(name)

	host, err := NetNSCookie("")
	if err != nil {
		t.Fatal(err)
	}
	inside, err := NetNSCookie(name)
	if err != nil {
		t.Fatal(err)
	}
	if host == 0 || inside == 0 || host == inside {
		t.Errorf("netns cookies host %d, %s %d: want two distinct non-zero", host, name, inside)
	}
	again, err := NetNSCookie("")
	if err != nil || again != host {
		t.Errorf("after InNetNS the host cookie is %d (%v), want %d", again, err, host)
	}
	wantErr := errors.New("from fn")
	if err := InNetNS(name, func() error { return wantErr }); !errors.Is(err, wantErr) {
		t.Errorf("fn's error lost: %v", err)
	}
	if err := InNetNS("eztunnel-no-such-netns", func() error { return nil }); err == nil {
		t.Error("a missing netns was entered")
	}
}

func TestTracepoint(t *testing.T) {
	if err := Tracepoint("sock_recv_length")(); err != nil {
		t.Errorf("sock_recv_length: %v", err)
	}
	if err := Tracepoint("no_such_tracepoint_xyz")(); err == nil {
		t.Error("a missing tracepoint passed")
	}
}

// TestFexit: the probe's program is well formed, so on a function of the
// kernel it either loads or is refused for permission (hosts that refuse
// tracing programs to some processes: EPERM), never rejected as invalid;
// a function the kernel lacks fails.
func TestFexit(t *testing.T) {
	err := Fexit("tcp_bpf_recvmsg")()
	if err != nil && !errors.Is(err, unix.EPERM) {
		t.Errorf("fexit/tcp_bpf_recvmsg: %v, want it loaded or refused with EPERM", err)
	}
	t.Logf("fexit/tcp_bpf_recvmsg: %v", err)
	if err := Fexit("no_such_function_xyz")(); err == nil || !strings.Contains(err.Error(), "no_such_function_xyz") {
		t.Errorf("a missing function: %v, want an error naming it", err)
	}
	// fentry has its own answer: the cache is keyed by the kind too.
	fe := Fentry("__nf_conntrack_confirm")()
	if fe != nil && !errors.Is(fe, unix.EPERM) && !strings.Contains(fe.Error(), "not found") {
		t.Errorf("fentry/__nf_conntrack_confirm: %v, want it loaded, refused with EPERM, or not found (nf_conntrack not loaded)", fe)
	}
	if fe != nil && !strings.HasPrefix(fe.Error(), "fentry/__nf_conntrack_confirm ") {
		t.Errorf("fentry's refusal %q does not name the fentry", fe)
	}
	t.Logf("fentry/__nf_conntrack_confirm: %v", fe)
}

// TestEnsureDirMissingParent: a pin directory whose parent does not exist
// yet is made inside /sys/fs/bpf, not on a second bpffs mounted over the
// parent (which uninstall could not remove).
func TestEnsureDirMissingParent(t *testing.T) {
	// A host booted without systemd's bpffs mount (CI's) gets one here, as
	// the agent's first EnsureDir gives it; the test needs it below.
	probe := filepath.Join(filepath.Dir(nodelayout.DefaultPinRoot), fmt.Sprintf("eztest-bpffs-%d", os.Getpid()))
	if err := EnsureDir(probe); err != nil {
		t.Fatal(err)
	}
	os.Remove(probe)
	if !IsBPFFS(nodelayout.DefaultPinRoot) && !IsBPFFS(filepath.Dir(nodelayout.DefaultPinRoot)) {
		t.Fatalf("%s is not on a BPF filesystem", filepath.Dir(nodelayout.DefaultPinRoot))
	}
	top := filepath.Join(filepath.Dir(nodelayout.DefaultPinRoot), fmt.Sprintf("eztest-ensure-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(top) })
	dir := filepath.Join(top, "v2", "links")
	if err := EnsureDir(dir); err != nil {
		t.Fatal(err)
	}
	if !IsBPFFS(dir) {
		t.Errorf("%s is not on a BPF filesystem", dir)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), top) {
		t.Errorf("EnsureDir mounted something under %s:\n%s", top, mounts)
		for _, p := range []string{filepath.Join(top, "v2"), top} {
			unix.Unmount(p, 0)
		}
	}
}
