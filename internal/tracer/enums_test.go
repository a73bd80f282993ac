package tracer

import "testing"

// TestEnumNames: every value of the C enums the tracer reports (ez_trc_table,
// ez_trc_end, ez_trc_stage, from bpf2go) has a name here, and the
// netfilter slots are sides * hooks * tables, as EZ_TRC_NF_SLOTS says.
func TestEnumNames(t *testing.T) {
	for i, tb := range tables {
		if tb.name == "" {
			t.Errorf("table class %d of enum ez_trc_table has no name", i)
		}
	}
	for i, n := range endNames {
		if n == "" {
			t.Errorf("end %d of enum ez_trc_end has no name", i)
		}
	}
	if want := len(nfSides) * len(hookNames) * tableCount; NFSlots != want {
		t.Errorf("EZ_TRC_NF_SLOTS is %d, not sides * hooks * tables = %d", NFSlots, want)
	}
	for s := Stage(0); s < StageCount; s++ {
		if s.String() == "" {
			t.Errorf("stage %d of enum ez_trc_stage has no name", s)
		}
	}
}
