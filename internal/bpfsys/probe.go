package bpfsys

// Kernel feature probes: checked before anything is loaded, naming what is missing.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Requirement is one thing the datapath needs.
type Requirement struct {
	Name  string
	Check func() error
}

// Check runs every requirement and returns one error naming all that failed.
func Check(reqs []Requirement) error {
	missing := Unmet(reqs)
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("kernel or process cannot run eztunnel:\n  - %s", strings.Join(missing, "\n  - "))
}

// Unmet lists the requirements that failed, each with its error.
func Unmet(reqs []Requirement) []string {
	var missing []string
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			missing = append(missing, fmt.Sprintf("%s: %v", r.Name, err))
		}
	}
	return missing
}

// Root checks the process runs as uid 0. Its capabilities (CAP_BPF,
// CAP_NET_ADMIN, CAP_PERFMON: SECURITY.md) survive exec only for root without
// ambient capabilities, and it opens root-owned pins and namespace files.
func Root() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	return nil
}

// BTF checks the kernel exposes its BTF (/sys/kernel/btf/vmlinux).
func BTF() error {
	_, err := btf.LoadKernelSpec()
	return err
}

// Tracepoint checks the kernel has a BTF-enabled tracepoint (tp_btf/<name>):
// its btf_trace_<name> typedef is in the kernel's BTF. (Probing the tracing
// program type itself needs an attach target: features refuses it with EPERM.)
func Tracepoint(name string) func() error {
	return func() error {
		spec, err := btf.LoadKernelSpec()
		if err != nil {
			return err
		}
		var td *btf.Typedef
		if err := spec.TypeByName("btf_trace_"+name, &td); err != nil {
			return fmt.Errorf("no tracepoint %s in the kernel's BTF: %w", name, err)
		}
		return nil
	}
}

// Fexit checks an fexit program on the kernel function fn loads: the
// function is in the kernel's BTF (or a loaded module's), and this kernel
// and process may attach tracing programs to functions (hardened hosts
// refuse them; some refuse them to any process but PID 1, with EPERM and
// "processed 0 insns"). It loads a two-instruction program and closes it;
// the answer is kept.
func Fexit(fn string) func() error { return tracingProbe(ebpf.AttachTraceFExit, "fexit", fn) }

// Fentry is Fexit for an fentry program.
func Fentry(fn string) func() error { return tracingProbe(ebpf.AttachTraceFEntry, "fentry", fn) }

// MapElemIter reports, nil or why not, whether this process may load an
// iterator over a map's elements of target's kind (bpf_sk_storage_map,
// bpf_map_elem, sockmap): kernels of this project's own machine kind refuse
// them with EPERM to any process but the global PID 1 (docs/kernels.md).
func MapElemIter(target string) func() error {
	return tracingProbe(ebpf.AttachTraceIter, "iter", target)
}

func tracingProbe(at ebpf.AttachType, kind, fn string) func() error {
	return func() error {
		key := kind + "/" + fn
		tracingMu.Lock()
		defer tracingMu.Unlock()
		if err, ok := tracingSeen[key]; ok {
			return err
		}
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.Tracing,
			AttachType:   at,
			AttachTo:     fn,
			License:      "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		})
		switch {
		case err == nil:
			prog.Close()
		case errors.Is(err, unix.EPERM):
			// Not cilium/ebpf's MEMLOCK hint: BPF memory is charged to
			// the memory cgroup since Linux 5.11, so it is the kernel
			// that refuses the program.
			err = fmt.Errorf("%s refused: %w", key, unix.EPERM)
		default:
			err = fmt.Errorf("%s does not load: %w", key, err)
		}
		tracingSeen[key] = err
		return err
	}
}

var (
	tracingMu   sync.Mutex
	tracingSeen = map[string]error{}
)

// KernelFunc checks the kernel's BTF has a function of that name: code that
// is there or not, where no trial load or version can tell (a distribution's
// or a patched kernel's).
func KernelFunc(name string) func() error {
	return func() error {
		spec, err := btf.LoadKernelSpec()
		if err != nil {
			return err
		}
		var fn *btf.Func
		if err := spec.TypeByName(name, &fn); err != nil {
			return fmt.Errorf("no function %s in the kernel's BTF", name)
		}
		return nil
	}
}

// EnumValue checks the kernel's BTF has an enumerator of that name: a
// constant that arrives with the code that handles it (for example
// TCP_BPF_SOCK_OPS_CB_FLAGS, which bpf_setsockopt accepts from Linux 6.10)
// where no trial load can tell, since the verifier does not check values.
func EnumValue(name string) func() error {
	return func() error {
		found, err := enumValues()
		if err != nil {
			return err
		}
		if !found[name] {
			return fmt.Errorf("no %s in the kernel's BTF", name)
		}
		return nil
	}
}

// enumValues reads every enumerator name of the kernel's BTF once.
var enumValues = sync.OnceValues(func() (map[string]bool, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, err
	}
	found := map[string]bool{}
	for t, err := range spec.All() {
		if err != nil {
			return nil, err
		}
		if e, ok := t.(*btf.Enum); ok {
			for _, v := range e.Values {
				found[v.Name] = true
			}
		}
	}
	return found, nil
})

// ProgType checks the kernel supports a program type.
func ProgType(t ebpf.ProgramType) func() error {
	return func() error { return features.HaveProgramType(t) }
}

// MapType checks the kernel supports a map type.
func MapType(t ebpf.MapType) func() error {
	return func() error { return features.HaveMapType(t) }
}

// Helper checks a program type may call a helper.
func Helper(pt ebpf.ProgramType, fn asm.BuiltinFunc) func() error {
	return func() error { return features.HaveProgramHelper(pt, fn) }
}

// TCX checks the kernel has tcx links (Linux 6.6), with a sched_cls program:
// a link to an interface that cannot exist fails with ENODEV where tcx is
// there, and as not supported where it is not. Nothing is attached.
func TCX(prog *ebpf.Program) error {
	l, err := link.AttachTCX(link.TCXOptions{Interface: math.MaxInt32, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err == nil {
		l.Close()
		return nil
	}
	if errors.Is(err, ebpf.ErrNotSupported) {
		return errors.New("tcx links not supported (Linux 6.6)")
	}
	return nil
}
