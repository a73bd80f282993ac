package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/parts"
)

// TestFeatureEnabledReasons: the reason label is "" for a part that runs
// and one of parts.Codes for one that does not, whatever the report's
// status holds (a code outside the set exports as error); the prose
// reason is never a label.
func TestFeatureEnabledReasons(t *testing.T) {
	var rep parts.Report
	rep.On(parts.Shortcut, "sockops")
	for i, c := range append([]parts.Code{"kernel said no", ""}, parts.Codes...) {
		if i >= len(parts.All)-1 {
			break
		}
		rep.Off(parts.All[i+1], c, "a long reason in words: program ez_x (part): refused")
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(FeatureEnabled(rep))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			seen++
			var reason, feature string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "reason":
					reason = l.GetValue()
				case "feature":
					feature = l.GetValue()
				}
			}
			runs := m.GetGauge().GetValue() == 1
			if runs && reason != "" || !runs && !parts.Known(parts.Code(reason)) {
				t.Errorf("feature %s: value %v, reason %q: want 1 with \"\" or 0 with a code of parts.Codes", feature, m.GetGauge().GetValue(), reason)
			}
			if feature == string(parts.All[1]) && reason != string(parts.CodeError) {
				t.Errorf("a status with a code outside the set exports reason %q, want error", reason)
			}
		}
	}
	if seen != len(rep.Parts) || seen < 10 {
		t.Errorf("%d series for %d parts", seen, len(rep.Parts))
	}
}
