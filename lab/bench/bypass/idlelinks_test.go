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
		r.hooks[0] = map[string]bench.ProgStat{"ez_sc_close_reset": {Runs: a}, "ez_sc_egress": {Runs: 5}}
		r.hooks[1] = map[string]bench.ProgStat{"ez_sc_close_reset": {Runs: b}, "ez_sc_egress": {Runs: 5}}
		return r
	}
	reset, egress := map[string]bool{"ez_sc_close_reset": true}, map[string]bool{"ez_sc_egress": true}
	for _, c := range []struct {
		name           string
		a, b           uint64
		switched, kept map[string]bool
		ok             bool
	}{
		{"every link switched, a program ran detached", 0, 10, nil, nil, false}, // egress ran in A
		{"the close reset switched, egress kept", 0, 10, reset, egress, true},
		{"the close reset ran detached", 1, 10, reset, egress, false},
		{"the close reset switched, not on the path", 0, 0, reset, egress, true},
		{"a program of both kinds of link may run in A", 3, 10, reset, map[string]bool{"ez_sc_close_reset": true, "ez_sc_egress": true}, true},
	} {
		if err := checkIdleRuns(row(c.a, c.b), c.switched, c.kept); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
	var r pairedRow
	r.hooks[0] = map[string]bench.ProgStat{"ez_sc_egress": {}}
	r.hooks[1] = map[string]bench.ProgStat{"ez_sc_egress": {Runs: 4}}
	if err := checkIdleRuns(r, nil, nil); err != nil {
		t.Errorf("every link switched, egress only attached: %v", err)
	}
	r.hooks[1] = map[string]bench.ProgStat{"ez_sc_egress": {}}
	if err := checkIdleRuns(r, nil, nil); err == nil {
		t.Error("every link switched, no program ran attached: no error")
	}
}

func TestLinkNameNotTCX(t *testing.T) {
	if n, err := linkName("links/cgroup/ez_sc_egress", ""); err != nil || n != "links/cgroup/ez_sc_egress" {
		t.Errorf("a cgroup link: %q, %v", n, err)
	}
}
