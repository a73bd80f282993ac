package bypass

import (
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/lab/bench"
)

func TestSameLinks(t *testing.T) {
	before := map[string]string{"links/tcx/1/2/ez_sc_close_reset_in": "type tcx, program 7, ifindex 2 ingress, the hook's programs [7]", "links/tracing/ez_sc_splice": "type raw_tracepoint, program 9"}
	same := map[string]string{"links/tcx/1/2/ez_sc_close_reset_in": "type tcx, program 7, ifindex 2 ingress, the hook's programs [7]", "links/tracing/ez_sc_splice": "type raw_tracepoint, program 9"}
	if err := sameLinks(before, same); err != nil {
		t.Errorf("the same links: %v", err)
	}
	for name, after := range map[string]map[string]string{
		"gone":      {"links/tracing/ez_sc_splice": "type raw_tracepoint, program 9"},
		"new":       {"links/tcx/1/2/ez_sc_close_reset_in": before["links/tcx/1/2/ez_sc_close_reset_in"], "links/tracing/ez_sc_splice": "type raw_tracepoint, program 9", "links/x": "y"},
		"reordered": {"links/tcx/1/2/ez_sc_close_reset_in": "type tcx, program 7, ifindex 2 ingress, the hook's programs [8 7]", "links/tracing/ez_sc_splice": "type raw_tracepoint, program 9"},
	} {
		err := sameLinks(before, after)
		if err == nil || !strings.Contains(err.Error(), name) && name != "reordered" {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCheckIdleRuns(t *testing.T) {
	row := func(a, b uint64) pairedRow {
		var r pairedRow
		r.hooks[0] = map[string]bench.ProgStat{"ez_sc_close_reset": {Runs: a}}
		r.hooks[1] = map[string]bench.ProgStat{"ez_sc_close_reset": {Runs: b}}
		return r
	}
	for _, c := range []struct {
		a, b   uint64
		subset bool
		ok     bool
	}{
		{0, 10, false, true},
		{1, 10, false, false}, // a program ran with every link detached
		{0, 0, false, false},  // none ran attached
		{5, 10, true, true},   // the links that stay run in A too
		{10, 10, true, false}, // the switch changed nothing
	} {
		if err := checkIdleRuns(row(c.a, c.b), c.subset); (err == nil) != c.ok {
			t.Errorf("A %d runs, B %d, subset %v: %v, want ok %v", c.a, c.b, c.subset, err, c.ok)
		}
	}
}

func TestLinkNameNotTCX(t *testing.T) {
	if n, err := linkName("links/cgroup/ez_sc_egress", ""); err != nil || n != "links/cgroup/ez_sc_egress" {
		t.Errorf("a cgroup link: %q, %v", n, err)
	}
}
