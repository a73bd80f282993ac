package parts

import (
	"errors"
	"path/filepath"
	"testing"
)

func TestReport(t *testing.T) {
	var r Report
	r.On(Tracer, "tp_btf")
	r.Off(Shortcut, CodeVerifierRejected, "program ez_sc_recv (read-accounting): refused")
	r.On(Shortcut, "sockops") // a later status replaces the earlier one
	if !r.Runs(Shortcut) || len(r.Parts) != 2 {
		t.Fatalf("Set did not replace: %+v", r.Parts)
	}
	if r.Runs(Bypass) {
		t.Error("a part never reported runs")
	}
	if s := r.Sorted(); s[0].Part != Shortcut || s[1].Part != Tracer {
		t.Errorf("Sorted is not in the order of All: %+v", s)
	}
	var o Report
	o.Off(Bypass, CodeNodeUnsuitable, "nf_conntrack is not loaded")
	r.Merge(o)
	if st, ok := r.Get(Bypass); !ok || st.Runs || st.Reason != "nf_conntrack is not loaded" || st.Label() != "node_unsuitable" {
		t.Errorf("Merge: %+v %v", st, ok)
	}
}

func TestWriteRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "x.parts.json")
	if _, err := Read(path); !errors.Is(err, ErrNoReport) {
		t.Fatalf("Read of a missing report: %v, want ErrNoReport", err)
	}
	r := Report{Kernel: "6.1.0"}
	r.Off(CloseReset, CodeKernelLacksTCX, "tcx links not supported (Linux 6.6)")
	if err := r.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if st, _ := got.Get(CloseReset); err != nil || got.Kernel != "6.1.0" || got.Runs(CloseReset) || len(got.Parts) != 1 || st.Code != CodeKernelLacksTCX {
		t.Fatalf("Read: %+v %v", got, err)
	}
}
