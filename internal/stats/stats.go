// Package stats computes the summaries the benchmarks report.
package stats

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Summary of a sample, in the sample's unit.
type Summary struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	P1     float64 `json:"p1"`
	P25    float64 `json:"p25"`
	P50    float64 `json:"p50"`
	Mean   float64 `json:"mean"`
	P75    float64 `json:"p75"`
	P99    float64 `json:"p99"`
	P999   float64 `json:"p999"`
	Max    float64 `json:"max"`
	StdDev float64 `json:"stddev"` // population standard deviation (dissertation eq. 5.1)
	PDV    float64 `json:"pdv"`    // packet delay variation P99 - P1 (RFC 5481 style)
}

// Quantile of sorted xs by linear interpolation between closest ranks
// (the R-7 / NumPy default definition).
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// Summarize computes a Summary; xs is not modified.
func Summarize(xs []float64) Summary {
	s := Summary{N: len(xs)}
	if len(xs) == 0 {
		return s
	}
	sorted := append([]float64(nil), xs...)
	sort.Float64s(sorted)
	var sum float64
	for _, x := range sorted {
		sum += x
	}
	s.Mean = sum / float64(len(xs))
	var sq float64
	for _, x := range sorted {
		sq += (x - s.Mean) * (x - s.Mean)
	}
	s.StdDev = math.Sqrt(sq / float64(len(xs)))
	s.Min, s.Max = sorted[0], sorted[len(sorted)-1]
	s.P1 = Quantile(sorted, 0.01)
	s.P25 = Quantile(sorted, 0.25)
	s.P50 = Quantile(sorted, 0.50)
	s.P75 = Quantile(sorted, 0.75)
	s.P99 = Quantile(sorted, 0.99)
	s.P999 = Quantile(sorted, 0.999)
	s.PDV = s.P99 - s.P1
	return s
}

// Micros converts durations to microseconds.
func Micros(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Microsecond)
	}
	return out
}

// QuantileMicros is the q-quantile (R-7, as Quantile) of ds in µs; ds is
// not modified.
func QuantileMicros(ds []time.Duration, q float64) float64 {
	xs := Micros(ds)
	slices.Sort(xs)
	return Quantile(xs, q)
}

// Change is the relative change from base to x in percent.
func Change(base, x float64) float64 {
	if base == 0 {
		return math.NaN()
	}
	return (x - base) / base * 100
}
