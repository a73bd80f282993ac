package bpfsys

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/parts"
)

// twoPrograms is an object of two socket filters that share one map.
func twoPrograms() *ebpf.CollectionSpec {
	prog := func(name string) *ebpf.ProgramSpec {
		return &ebpf.ProgramSpec{Name: name, Type: ebpf.SocketFilter, License: "GPL", Instructions: asm.Instructions{
			asm.LoadMapPtr(asm.R1, 0).WithReference("shared"),
			asm.Mov.Imm(asm.R0, 0),
			asm.Return(),
		}}
	}
	return &ebpf.CollectionSpec{
		Maps:     map[string]*ebpf.MapSpec{"shared": {Name: "shared", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}},
		Programs: map[string]*ebpf.ProgramSpec{"first": prog("first"), "second": prog("second")},
	}
}

// TestLoadGroups: each group loads on its own against one set of maps; a
// refused optional program turns off its part only, a refused required one
// fails the load naming the program and the part, and AssignPrograms fills
// a bpf2go-style struct (nil where a part is off).
func TestLoadGroups(t *testing.T) {
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	ps, err := LoadMaps(twoPrograms(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	t.Setenv(TestRefuseEnv, "second")
	var rep parts.Report
	loaded, err := ps.LoadGroups([]Group{
		{Part: parts.Shortcut, Required: true, Progs: []string{"first"}, Via: "one"},
		{Part: parts.Adoption, Progs: []string{"second"}},
		{Part: parts.CloseReset, Off: parts.WithCode(parts.CodeDisabledByFlag, errors.New("not in this mode"))},
		{Part: parts.NodePort, Progs: []string{"first"}, Attach: func(*ebpf.Program) error { return errors.New("cannot attach") }},
	}, &rep)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseAll(loaded)
	if st, _ := rep.Get(parts.NodePort); st.Runs || st.Reason != "program first (nodeport): cannot attach" || st.Code != parts.CodeError {
		t.Errorf("a group its Attach check refuses: %+v", st)
	}
	if !rep.Runs(parts.Shortcut) || rep.Runs(parts.Adoption) || rep.Runs(parts.CloseReset) {
		t.Fatalf("report: %+v", rep.Parts)
	}
	if st, _ := rep.Get(parts.Adoption); !strings.Contains(st.Reason, "program second (adoption)") || !strings.Contains(st.Reason, ErrTestRefused.Error()) ||
		st.Code != parts.CodeRefusedForTest {
		t.Errorf("adoption's reason: %q (%s)", st.Reason, st.Code)
	}
	if st, _ := rep.Get(parts.CloseReset); st.Reason != "not in this mode" || st.Code != parts.CodeDisabledByFlag {
		t.Errorf("a group off by configuration: %+v", st)
	}
	var objs struct {
		First  *ebpf.Program `ebpf:"first"`
		Second *ebpf.Program `ebpf:"second"`
	}
	AssignPrograms(loaded, &objs)
	if objs.First == nil || objs.Second != nil {
		t.Errorf("AssignPrograms: first %v, second %v", objs.First, objs.Second)
	}
	if _, err := ps.LoadGroups([]Group{{Part: parts.Release, Required: true, Progs: []string{"second"}}}, &rep); err == nil ||
		!strings.Contains(err.Error(), "program second (release)") {
		t.Errorf("a refused required program: %v", err)
	}
}
