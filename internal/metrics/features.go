package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/parts"
)

// FeatureEnabled is eztunnel_feature_enabled{feature,reason}: 1 for each
// part of the datapath the agent runs; 0 with the reason for each it does
// not (the kernel refused a program, named; a module not loaded; a flag).
func FeatureEnabled(rep parts.Report) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "feature_enabled",
		Help: "1 for each part of the datapath the agent runs; 0 with the reason for each it does not.",
	}, []string{"feature", "reason"})
	for _, s := range rep.Sorted() {
		v := 0.0
		if s.Runs {
			v = 1
		}
		g.WithLabelValues(string(s.Part), s.Reason).Set(v)
	}
	return g
}
