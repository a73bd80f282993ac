package bypass

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestBypassVerifies loads the bypass programs: the verifier must accept it,
// with the conntrack kfuncs resolved against the running kernel's BTF.
// Nothing is attached.
func TestBypassVerifies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	spec, err := loadBypass()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"ez_bp_tcp_timeout_ms", "ez_bp_udp_timeout_ms"} {
		if err := spec.Variables[v].Set(uint32(60_000)); err != nil {
			t.Fatal(err)
		}
	}
	if err := spec.Variables["ez_bp_admit_mark"].Set([2]uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	var objs bypassObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("%+v", ve)
		}
		t.Fatal(err)
	}
	defer objs.Close()
	if objs.EzBypass == nil || objs.EzBypassAdmit == nil || objs.EzBypassIn == nil || objs.EzBpEndpoints == nil || objs.EzBpDevices == nil || objs.EzBpCounters == nil {
		t.Fatal("program or maps missing after load")
	}
	for _, p := range []*ebpf.Program{objs.EzBypass, objs.EzBypassAdmit, objs.EzBypassIn} {
		if p.Type() != ebpf.SchedCLS {
			t.Errorf("program type %s, want %s", p.Type(), ebpf.SchedCLS)
		}
	}
}

// TestCounterNamesComplete: every enum value has a name, all distinct.
func TestCounterNamesComplete(t *testing.T) {
	if err := counters.Check(); err != nil {
		t.Fatal(err)
	}
}
