package stats

import "sort"

// CDF returns at most points (x, P(X <= x)) pairs of the empirical
// distribution of xs, evenly spaced in probability, for plotting. With
// points >= len(xs) every sample is a step: the i-th smallest (from 0)
// has probability (i+1)/n.
func CDF(xs []float64, points int) (x, p []float64) {
	n := len(xs)
	if n == 0 || points < 1 {
		return nil, nil
	}
	sorted := append([]float64(nil), xs...)
	sort.Float64s(sorted)
	if points >= n {
		for i, v := range sorted {
			x = append(x, v)
			p = append(p, float64(i+1)/float64(n))
		}
		return x, p
	}
	for k := 1; k <= points; k++ {
		i := (k*n + points - 1) / points // ceil(k*n/points): rank of probability k/points
		x = append(x, sorted[i-1])
		p = append(p, float64(i)/float64(n))
	}
	return x, p
}
