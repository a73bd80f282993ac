package stats

import (
	"math"
	"testing"
	"time"
)

// Hand-computed: xs = 2, 4, 4, 4, 5, 5, 7, 9 has mean 5 and population
// standard deviation exactly 2 (the textbook example). R-7 quantiles over
// 8 values sit at positions q*7: p25 at 1.75 -> 4, p75 at 5.25 -> 5.5,
// p1 at 0.07 -> 2.14, p99 at 6.93 -> 8.86, so PDV = 6.72.
func TestSummarizeByHand(t *testing.T) {
	xs := []float64{9, 2, 4, 5, 4, 7, 4, 5}
	s := Summarize(xs)
	if xs[0] != 9 {
		t.Error("Summarize sorted its input")
	}
	want := Summary{N: 8, Min: 2, P1: 2.14, P25: 4, P50: 4.5, Mean: 5, P75: 5.5, P99: 8.86, P999: 8.986, Max: 9, StdDev: 2, PDV: 6.72}
	got := []float64{s.Min, s.P1, s.P25, s.P50, s.Mean, s.P75, s.P99, s.P999, s.Max, s.StdDev, s.PDV}
	exp := []float64{want.Min, want.P1, want.P25, want.P50, want.Mean, want.P75, want.P99, want.P999, want.Max, want.StdDev, want.PDV}
	for i := range got {
		if math.Abs(got[i]-exp[i]) > 1e-9 {
			t.Errorf("field %d: got %v want %v (%+v)", i, got[i], exp[i], s)
		}
	}
	if s.N != 8 {
		t.Errorf("n %d", s.N)
	}
}

func TestChange(t *testing.T) {
	if got := Change(200, 110); math.Abs(got+45) > 1e-9 {
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

func TestCDF(t *testing.T) {
	x, p := CDF([]float64{3, 1, 2, 4}, 10)
	if len(x) != 4 || x[0] != 1 || x[3] != 4 || p[0] != 0.25 || p[3] != 1 {
		t.Errorf("all points: %v %v", x, p)
	}
	// 10 samples, 4 points: ranks ceil(k*10/4) = 3, 5, 8, 10.
	xs := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	x, p = CDF(xs, 4)
	wantX, wantP := []float64{3, 5, 8, 10}, []float64{0.3, 0.5, 0.8, 1}
	for i := range wantX {
		if x[i] != wantX[i] || math.Abs(p[i]-wantP[i]) > 1e-12 {
			t.Errorf("point %d: (%v, %v), want (%v, %v)", i, x[i], p[i], wantX[i], wantP[i])
		}
	}
	if x, _ := CDF(nil, 5); x != nil {
		t.Error("empty sample")
	}
}

func TestQuantileMicros(t *testing.T) {
	ds := []time.Duration{4 * time.Microsecond, time.Microsecond, 3 * time.Microsecond, 2 * time.Microsecond}
	if got := QuantileMicros(ds, 0.5); got != 2.5 {
		t.Errorf("median of 1..4 µs: %v, want 2.5", got)
	}
	if ds[0] != 4*time.Microsecond {
		t.Errorf("the input was sorted in place: %v", ds)
	}
}
