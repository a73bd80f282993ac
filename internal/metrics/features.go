package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/parts"
)

// FeatureEnabled is eztunnel_feature_enabled{feature,reason}: 1 (reason "")
// for each part of the datapath the agent runs; 0 with the reason's code
// (parts.Codes: disabled_by_flag, kernel_lacks_kfunc, ...) for each it does
// not. The reason itself, naming the program, is in the log and `status`.
func FeatureEnabled(rep parts.Report) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "feature_enabled",
		Help: "1 for each part of the datapath the agent runs; 0 for each it does not, with the reason's code (disabled_by_flag, node_unsuitable, verifier_rejected, kernel_lacks_kfunc, kernel_lacks_tcx, kernel_lacks_feature, not_permitted, needs_part, refused_for_test, error).",
	}, []string{"feature", "reason"})
	for _, s := range rep.Sorted() {
		v := 0.0
		if s.Runs {
			v = 1
		}
		g.WithLabelValues(string(s.Part), s.Label()).Set(v)
	}
	return g
}
