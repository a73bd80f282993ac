package bench

import (
	"fmt"
	"math"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// Runs of one paired comparison. A run's interval (ComparePairedBlocks)
// holds what moves between its blocks, over the run's minutes; it cannot
// hold a change of the host between runs half an hour apart, and on these
// VMs the host changes: the same effect, measured again, lands outside the
// first run's interval when the host became slower or faster meanwhile
// (docs/measurements/benchmarks.md). PoolRuns says by how much the runs
// differ beyond their own intervals and gives the estimate that holds
// across them: a random-effects meta-analysis of the runs (DerSimonian
// and Laird's between-run variance, with the Hartung-Knapp interval, which
// uses a t quantile with runs-1 degrees of freedom and so stays honest for
// three runs).

// RunPhases is one run's phases of a paired comparison: A[k] and B[k] are
// block k's two sides (as ComparePairedBlocks takes them), Seed the run's
// seed.
type RunPhases struct {
	A, B [][]float64
	Seed uint64
}

// Pooled is a paired comparison over several runs.
type Pooled struct {
	// Runs are each run's comparison, as the run reported it.
	Runs []Paired
	// SE is each run's standard error: the standard deviation of its
	// bootstrap medians.
	SE []float64
	// Agree: the runs' intervals share a point.
	Agree bool
	// Median, Lo, Hi: the random-effects estimate across the runs and its
	// 95% interval.
	Median, Lo, Hi float64
	// Tau is the standard deviation of the true effect between runs
	// (percentage points), beyond what each run's own error explains.
	Tau float64
	// I2 is the share of the runs' spread that their own errors do not
	// explain (0 to 1).
	I2 float64
}

// PoolRuns pools at least two runs of one paired comparison.
func PoolRuns(runs []RunPhases) (Pooled, error) {
	k := len(runs)
	if k < 2 {
		return Pooled{}, fmt.Errorf("pooling runs: %d run(s), want at least 2", k)
	}
	var p Pooled
	est, v := make([]float64, k), make([]float64, k)
	for i, r := range runs {
		if len(r.A) < MinPoolBlocks {
			return Pooled{}, fmt.Errorf("run %d has %d block(s), want at least %d: its interval's width is not an estimate to weigh it by", i+1, len(r.A), MinPoolBlocks)
		}
		// The run's comparison as ComparePairedBlocks makes it, and its
		// standard error from the same resamples.
		c, meds, err := comparePairedBlocks(r.A, r.B, r.Seed, PairedResamples, ExpandedTail)
		if err != nil {
			return Pooled{}, fmt.Errorf("run %d: %w", i+1, err)
		}
		se := stat.StdDev(meds, nil)
		if se <= 0 || math.IsNaN(se) {
			// Every resample the same median: nothing to weigh by.
			return Pooled{}, fmt.Errorf("run %d: its bootstrap medians do not vary (standard error %v)", i+1, se)
		}
		p.Runs, p.SE = append(p.Runs, c), append(p.SE, se)
		est[i], v[i] = c.Median, se*se
	}
	lo, hi := math.Inf(-1), math.Inf(1)
	for _, c := range p.Runs {
		lo, hi = max(lo, c.Lo), min(hi, c.Hi)
	}
	p.Agree = lo <= hi
	p.Median, p.Lo, p.Hi, p.Tau, p.I2 = randomEffects(est, v)
	return p, nil
}

// MinPoolBlocks is the fewest blocks a pooled run may have: its weight is
// one over its bootstrap variance, and a bootstrap over two or three blocks
// can put that variance near 0 (two blocks of similar medians), so one run
// would outweigh the others.
const MinPoolBlocks = 5

// randomEffects pools estimates est with variances v: DerSimonian-Laird's
// between-study variance tau², the weights 1/(v+tau²), and the
// Hartung-Knapp interval with its usual floor (its variance never below
// the weights' own, so it is never narrower than the plain random-effects
// interval).
func randomEffects(est, v []float64) (mu, lo, hi, tau, i2 float64) {
	k := float64(len(est))
	var sw, sw2, swx float64
	for i := range est {
		w := 1 / v[i]
		sw, sw2, swx = sw+w, sw2+w*w, swx+w*est[i]
	}
	fixed := swx / sw
	var q float64
	for i := range est {
		q += (est[i] - fixed) * (est[i] - fixed) / v[i]
	}
	tau2 := max(0, (q-(k-1))/(sw-sw2/sw))
	if q > 0 {
		i2 = max(0, (q-(k-1))/q)
	}
	var sws, swsx float64
	for i := range est {
		w := 1 / (v[i] + tau2)
		sws, swsx = sws+w, swsx+w*est[i]
	}
	mu = swsx / sws
	var qs float64
	for i := range est {
		qs += (est[i] - mu) * (est[i] - mu) / (v[i] + tau2)
	}
	se := math.Sqrt(max(1, qs/(k-1)) / sws)
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: k - 1}.Quantile(0.975)
	return mu, mu - t*se, mu + t*se, math.Sqrt(tau2), i2
}

// Paired is the pooled estimate as one comparison (Pairs and Blocks summed
// over the runs), for Judge and String.
func (p Pooled) Paired() Paired {
	out := Paired{Median: p.Median, Lo: p.Lo, Hi: p.Hi}
	for _, r := range p.Runs {
		out.Pairs += r.Pairs
		out.Blocks += r.Blocks
	}
	return out
}
