package bypass

import (
	"strings"
	"testing"
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
