package stats

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// Values computed by hand: xs = 1..10.
func TestSummarizeHandComputed(t *testing.T) {
	xs := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	s := Summarize(xs)
	// mean 5.5; population variance = sum((x-5.5)^2)/10 = 82.5/10 = 8.25
	checks := map[string][2]float64{
		"mean":   {s.Mean, 5.5},
		"stddev": {s.StdDev, math.Sqrt(8.25)},
		"p50":    {s.P50, 5.5},  // pos 4.5 -> 5 + 0.5*(6-5)
		"p25":    {s.P25, 3.25}, // pos 2.25 -> 3 + 0.25
		"p75":    {s.P75, 7.75}, // pos 6.75 -> 7 + 0.75
		"p1":     {s.P1, 1.09},  // pos 0.09
		"p99":    {s.P99, 9.91}, // pos 8.91
		"pdv":    {s.PDV, 9.91 - 1.09},
		"min":    {s.Min, 1},
		"max":    {s.Max, 10},
	}
	for name, c := range checks {
		if !near(c[0], c[1]) {
			t.Errorf("%s = %v, want %v", name, c[0], c[1])
		}
	}
	if xs[0] != 10 {
		t.Error("Summarize sorted its input")
	}
}

func TestChange(t *testing.T) {
	if got := Change(200, 110); !near(got, -45) {
		t.Errorf("Change(200,110) = %v, want -45", got)
	}
	if !math.IsNaN(Change(0, 1)) {
		t.Error("Change from 0 should be NaN")
	}
}

func TestEmpty(t *testing.T) {
	if s := Summarize(nil); s.N != 0 {
		t.Errorf("N = %d", s.N)
	}
}
