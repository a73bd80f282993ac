package services

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestServicesVerifies loads the programs: the verifier must accept them
// (sk_storage and bpf_set_retval in sock_addr programs, bpf_sock_destroy in
// the socket iterators). Nothing is attached.
func TestServicesVerifies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	lb, err := Load(Config{MaxFrontends: 64, MaxBackends: 64, MaxSlots: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	want := map[ebpf.AttachType]ebpf.ProgramType{
		ebpf.AttachCGroupGetsockopt:      ebpf.CGroupSockopt,
		ebpf.AttachCgroupInetSockRelease: ebpf.CGroupSock,
		ebpf.AttachCGroupSockOps:         ebpf.SockOps,
	}
	for _, h := range lb.hooks() {
		w, ok := want[h.at]
		if !ok {
			w = ebpf.CGroupSockAddr
		}
		if h.prog.Type() != w {
			t.Errorf("%s: program type %s, want %s", h.at, h.prog.Type(), w)
		}
	}
	for _, p := range []*ebpf.Program{lb.objs.EzSvcDestroyTcp, lb.objs.EzSvcDestroyUdp} {
		if p.Type() != ebpf.Tracing {
			t.Errorf("socket iterator: program type %s, want %s", p.Type(), ebpf.Tracing)
		}
	}
	if got := lb.objs.EzSvcFrontends.MaxEntries(); got != 64 {
		t.Errorf("frontends map sized %d, want 64", got)
	}
}

// TestCounterNamesComplete: every enum value has a name, all distinct.
func TestCounterNamesComplete(t *testing.T) {
	if err := counters.Check(); err != nil {
		t.Fatal(err)
	}
}
