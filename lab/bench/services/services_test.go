package services

import (
	"math"
	"testing"
)

// The paper's split: Services 0..2766 are NodePort 30000..32766, the rest
// ClusterIP.
func TestNodePortSplit(t *testing.T) {
	if nodePort(0) != 30000 || nodePort(MaxNodePorts-1) != 32766 || nodePort(MaxNodePorts) != 0 {
		t.Fatalf("nodePort: %d %d %d", nodePort(0), nodePort(MaxNodePorts-1), nodePort(MaxNodePorts))
	}
	if s := service(MaxNodePorts - 1); s.Spec.Type != "NodePort" || s.Spec.ExternalTrafficPolicy != "Local" {
		t.Fatalf("service %d: %+v", MaxNodePorts-1, s.Spec)
	}
	if s := service(MaxNodePorts); s.Spec.Type != "" || s.Spec.Ports[0].NodePort != 0 {
		t.Fatalf("service %d: %+v", MaxNodePorts, s.Spec)
	}
}

// Bucket interpolation as Prometheus' histogram_quantile, on a delta.
func TestHistQuantile(t *testing.T) {
	inf := math.Inf(1)
	before := hist{bounds: []float64{0.01, 0.1, inf}, counts: []float64{5, 5, 5}, n: 5}
	after := hist{bounds: []float64{0.01, 0.1, inf}, counts: []float64{5, 15, 15}, n: 15}
	d := after.minus(before) // 10 observations, all in (0.01, 0.1]
	if d.n != 10 {
		t.Fatalf("n %v", d.n)
	}
	if q := d.quantile(0.5); math.Abs(q-0.055) > 1e-9 {
		t.Fatalf("p50 %v, want 0.055", q)
	}
	if q := (hist{}).quantile(0.5); !math.IsNaN(q) {
		t.Fatalf("empty: %v", q)
	}
}
