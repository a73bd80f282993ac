package services

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestServicesVerifies loads the programs: the verifier must accept them
// (sk_storage and bpf_set_retval in sock_addr programs). Nothing is attached.
func TestServicesVerifies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	lb, err := Load(Config{MaxFrontends: 64, MaxBackends: 64, MaxSlots: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	for _, h := range lb.hooks() {
		if h.prog.Type() != ebpf.CGroupSockAddr {
			t.Errorf("program type %s, want %s", h.prog.Type(), ebpf.CGroupSockAddr)
		}
	}
	if got := lb.objs.EzSvcFrontends.MaxEntries(); got != 64 {
		t.Errorf("frontends map sized %d, want 64", got)
	}
}

// TestCounterNamesComplete: every enum value has a name, all distinct.
func TestCounterNamesComplete(t *testing.T) {
	seen := map[string]bool{}
	for c := servicesEzSvcCounter(0); c < servicesEzSvcCounterEZ_SVC_C_MAX; c++ {
		n, ok := counterNames[c]
		if !ok {
			t.Errorf("counter %d has no name", c)
		}
		if seen[n] {
			t.Errorf("counter name %q used twice", n)
		}
		seen[n] = true
	}
	if len(counterNames) != int(servicesEzSvcCounterEZ_SVC_C_MAX) {
		t.Errorf("%d names for %d counters", len(counterNames), servicesEzSvcCounterEZ_SVC_C_MAX)
	}
}
