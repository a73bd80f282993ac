package main

import (
	"bytes"
	"regexp"
	"testing"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// TestStatusPartCode: a part that does not run shows its reason's code (the
// metrics' label) beside the reason in words; a report without codes (an
// older agent's) shows only the words.
func TestStatusPartCode(t *testing.T) {
	rep := &parts.Report{Kernel: "6.1.0"}
	rep.Off(parts.Bypass, parts.CodeKernelLacksTCX, "bypass: program ez_bypass: legacy tc filter: ENOENT")
	rep.Set(parts.Status{Part: parts.Tracer, Reason: "older agent"})
	var out bytes.Buffer
	printStatus(&out, &agentapi.NodeStatus{Parts: rep})
	for _, want := range []string{`(?m)^part bypass\s+off \(kernel_lacks_tcx\)\s+bypass: program ez_bypass`, `(?m)^part tracer\s+off\s+older agent$`} {
		if !regexp.MustCompile(want).Match(out.Bytes()) {
			t.Errorf("status lacks %s:\n%s", want, out.String())
		}
	}
}
