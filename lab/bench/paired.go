package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/eztunnel/eztunnel/internal/stats"
	"gonum.org/v1/gonum/stat/distuv"
)

// A paired comparison: the two sides (A, B) measured in alternating
// phases on the same flows, each phase summarised by one statistic (a
// median round trip), each pair of neighbouring phases giving one paired
// difference. The host's slow drift moves both phases of a pair alike and
// cancels in their difference; what is left is the effect plus the
// phase-to-phase noise, which the bootstrap interval measures. An A/A
// comparison (the same side in both phases, alternated the same way) must
// find an interval around 0: if it does not, or is wider than the effect
// to be judged, the run judges nothing.

// Paired is the result of a paired comparison.
type Paired struct {
	Pairs int
	// Blocks > 1: the pairs came in that many blocks (ComparePairedBlocks)
	// and the interval resampled whole blocks.
	Blocks int
	// Median of the paired differences, 100 * (B - A) / A per pair.
	Median float64
	// Lo, Hi: the 95% bootstrap interval of that median (PairedResamples
	// resamples; the expanded percentile method, ExpandedTail, in the
	// paired comparisons, the plain one in CompareMedians).
	Lo, Hi float64
}

// PairedResamples is the number of bootstrap resamples.
const PairedResamples = 4000

// ComparePaired is the paired comparison of a[i] and b[i], the two phases'
// statistics of pair i (positive: larger). The resampling is seeded by
// seed, so a report can be recomputed from its data.
func ComparePaired(a, b []float64, seed uint64) (Paired, error) {
	if len(a) != len(b) {
		return Paired{}, fmt.Errorf("paired comparison: %d A phases, %d B phases", len(a), len(b))
	}
	d, err := differences(a, b)
	if err != nil {
		return Paired{}, fmt.Errorf("paired comparison: %w", err)
	}
	if len(d) < 2 {
		return Paired{}, fmt.Errorf("paired comparison: %d pairs, want at least 2", len(d))
	}
	p := Paired{Pairs: len(d), Median: medianOf(d)}
	p.Lo, p.Hi = bootstrapMedian(d, PairedResamples, seed)
	return p, nil
}

// ComparePairedBlocks is ComparePaired of pairs measured in blocks: a[k]
// and b[k] are block k's pairs, each block on its own flows and at its own
// time of the run (a bench interleaves its rows' blocks). Median is the
// median of all the paired differences; the interval resamples whole
// blocks with replacement (a cluster bootstrap), so it holds what differs
// from block to block (a flow's placement, the host's drift over the run's
// minutes) and not only the phase-to-phase noise within one flow, which
// the pairs of one block share. With one block it is ComparePaired.
func ComparePairedBlocks(a, b [][]float64, seed uint64) (Paired, error) {
	p, _, err := comparePairedBlocks(a, b, seed, PairedResamples, ExpandedTail)
	return p, err
}

// comparePairedBlocks is ComparePairedBlocks with resamples resamples and
// the interval's tail each end for a number of blocks; with two blocks or
// more it also returns the resamples' medians (PoolRuns weighs a run by
// their spread).
func comparePairedBlocks(a, b [][]float64, seed uint64, resamples int, tailOf func(int) float64) (Paired, []float64, error) {
	if len(a) != len(b) || len(a) == 0 {
		return Paired{}, nil, fmt.Errorf("paired comparison: %d blocks of A phases, %d of B phases", len(a), len(b))
	}
	if len(a) == 1 {
		p, err := ComparePaired(a[0], b[0], seed)
		return p, nil, err
	}
	p, meds, err := blockBootstrap(a, b, seed, resamples)
	if err != nil {
		return Paired{}, nil, err
	}
	p.Lo, p.Hi = interval(meds, tailOf(p.Blocks))
	return p, meds, nil
}

// blockBootstrap is the paired comparison of blocks a and b (at least
// two) without its interval, and the medians of its resamples, each
// drawing whole blocks with replacement.
func blockBootstrap(a, b [][]float64, seed uint64, resamples int) (Paired, []float64, error) {
	blocks := make([][]float64, len(a))
	var all []float64
	for k := range a {
		if len(a[k]) != len(b[k]) || len(a[k]) == 0 {
			return Paired{}, nil, fmt.Errorf("paired comparison: block %d: %d A phases, %d B phases", k, len(a[k]), len(b[k]))
		}
		d, err := differences(a[k], b[k])
		if err != nil {
			return Paired{}, nil, fmt.Errorf("paired comparison: block %d, %w", k, err)
		}
		blocks[k] = d
		all = append(all, d...)
	}
	p := Paired{Pairs: len(all), Blocks: len(blocks), Median: medianOf(slices.Clone(all))}
	return p, resampledMedians(blocks, resamples, seed), nil
}

// ExpandedTail is the tail each end of a 95% percentile bootstrap
// interval leaves out when n units are resampled: the expanded percentile
// interval (Hesterberg, "What Teachers Should Know About the Bootstrap",
// 2015), whose tail is Φ(-sqrt(n/(n-1)) t(0.975, n-1)) instead of 2.5%.
// The plain percentile interval is too narrow for few units: it is as
// wide as a z interval with the divisor n where a t interval with n-1
// degrees of freedom is due. In TestExpandedCoverage (a bench's shape: 10
// blocks of 20 pairs, an effect per block and heavy-tailed pair noise) the
// plain interval held the true difference in 89.7% of 600 runs, the
// expanded one in 93.3% (1000 resamples; 90.5% and 95.0% with 4000): A/A
// rows that hold 0 by design excluded it about twice as often as they
// should. The tail is 0.86% for 10 units, 1.6%
// for 20, 2.4% for 200.
func ExpandedTail(n int) float64 {
	if n < 2 {
		return 0.025
	}
	t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(n - 1)}.Quantile(0.975)
	return distuv.UnitNormal.CDF(-math.Sqrt(float64(n)/float64(n-1)) * t)
}

// BlockMedians are the medians of each block's paired differences
// (percent), in block order: how far the blocks of a run spread.
func BlockMedians(a, b [][]float64) []float64 {
	var out []float64
	for k := range a {
		var d []float64
		for i := range min(len(a[k]), len(b[k])) {
			if a[k][i] > 0 {
				d = append(d, 100*(b[k][i]-a[k][i])/a[k][i])
			}
		}
		if len(d) > 0 {
			out = append(out, medianOf(d))
		}
	}
	return out
}

// differences are the per-pair differences 100 * (b[i] - a[i]) / a[i] of
// equally long a and b; a pair with A not above 0, or NaN, is an error.
func differences(a, b []float64) ([]float64, error) {
	d := make([]float64, 0, len(a))
	for i := range a {
		if a[i] <= 0 || math.IsNaN(a[i]) || math.IsNaN(b[i]) {
			return nil, fmt.Errorf("pair %d: A %v, B %v", i, a[i], b[i])
		}
		d = append(d, 100*(b[i]-a[i])/a[i])
	}
	return d, nil
}

// CompareMedians compares two samples taken apart (not paired: each
// step of bench scale is minutes from the other): Median is
// 100 * (median(b) - median(a)) / median(a), Lo and Hi its 95% bootstrap
// interval from resampling a and b each on its own, and Pairs the smaller
// sample. It does not cancel a drift of the host between the two: a
// report gives it next to a comparison that does.
func CompareMedians(a, b []float64, seed uint64) (Paired, error) {
	if len(a) < 2 || len(b) < 2 {
		return Paired{}, fmt.Errorf("comparison of medians: %d and %d values, want at least 2 each", len(a), len(b))
	}
	ma := medianOf(slices.Clone(a))
	if ma <= 0 || math.IsNaN(ma) {
		return Paired{}, fmt.Errorf("comparison of medians: median of A %v", ma)
	}
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	ra, rb := make([]float64, len(a)), make([]float64, len(b))
	d := make([]float64, PairedResamples)
	for i := range d {
		for j := range ra {
			ra[j] = a[r.IntN(len(a))]
		}
		for j := range rb {
			rb[j] = b[r.IntN(len(b))]
		}
		d[i] = 100 * (medianOf(rb)/medianOf(ra) - 1)
	}
	p := Paired{Pairs: min(len(a), len(b)), Median: 100 * (medianOf(slices.Clone(b))/ma - 1)}
	p.Lo, p.Hi = interval(d, 0.025)
	return p, nil
}

// bootstrapMedian is the 95% expanded percentile interval (ExpandedTail)
// of the median of d over n resamples with replacement.
func bootstrapMedian(d []float64, n int, seed uint64) (lo, hi float64) {
	units := make([][]float64, len(d))
	for i := range d {
		units[i] = d[i : i+1]
	}
	return interval(resampledMedians(units, n, seed), ExpandedTail(len(d)))
}

// resampledMedians are n bootstrap medians of units' values, each resample
// drawing len(units) whole units with replacement (seeded by seed).
func resampledMedians(units [][]float64, n int, seed uint64) []float64 {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	meds := make([]float64, n)
	var s []float64
	for i := range meds {
		s = s[:0]
		for range units {
			s = append(s, units[r.IntN(len(units))]...)
		}
		meds[i] = medianOf(s)
	}
	return meds
}

// interval sorts a bootstrap's resampled statistics in place and returns
// the interval that leaves tail out at each end.
func interval(meds []float64, tail float64) (lo, hi float64) {
	slices.Sort(meds)
	return stats.Quantile(meds, tail), stats.Quantile(meds, 1-tail)
}

// medianOf sorts xs in place and returns its median.
func medianOf(xs []float64) float64 {
	slices.Sort(xs)
	return stats.Quantile(xs, 0.5)
}

// Contains reports whether the interval holds x.
func (p Paired) Contains(x float64) bool { return p.Lo <= x && x <= p.Hi }

// Width is the interval's half-width in percentage points.
func (p Paired) Width() float64 { return (p.Hi - p.Lo) / 2 }

// String is "-12.3% [-14.0, -10.1]".
func (p Paired) String() string {
	return fmt.Sprintf("%+.1f%% [%+.1f, %+.1f]", p.Median, p.Lo, p.Hi)
}

// AAValid says whether an A/A row lets its report judge effects of at
// least maxHalfWidth percent: its interval must hold 0 and be within
// ±maxHalfWidth. The reason is "" when it does.
func (p Paired) AAValid(maxHalfWidth float64) string {
	switch {
	case !p.Contains(0):
		return fmt.Sprintf("the A/A interval %s does not hold 0: the phases differ without any change, this run judges nothing", p)
	case p.Lo < -maxHalfWidth || p.Hi > maxHalfWidth:
		return fmt.Sprintf("the A/A interval %s is wider than ±%.0f%%: this run cannot resolve effects that small", p, maxHalfWidth)
	}
	return ""
}

// AAMaxHalfWidth is the widest A/A interval (percent) a report may have
// and still judge the targets of that metric (issue 37: ±2% here).
const AAMaxHalfWidth = 2.0

// TryPaired is ComparePaired with a failure (fewer than two pairs, a zero
// A phase) as a Paired without pairs, whose Cell is "-".
func TryPaired(a, b []float64, seed uint64) Paired {
	p, err := ComparePaired(a, b, seed)
	if err != nil {
		return Paired{Median: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	return p
}

// Cell is String, or "-" without pairs.
func (p Paired) Cell() string {
	if p.Pairs == 0 {
		return "-"
	}
	return p.String()
}

// JudgedCell is a report's "judged" cell for a row whose A/A comparison is
// aa: "yes", or "no: " and why (AAValid with AAMaxHalfWidth).
func JudgedCell(aa Paired) string {
	switch {
	case aa.Pairs < 2:
		return "no: no A/A pairs"
	case !aa.Contains(0):
		return "no: A/A excludes 0"
	case aa.AAValid(AAMaxHalfWidth) != "":
		return fmt.Sprintf("no: A/A wider than ±%.0f%%", AAMaxHalfWidth)
	}
	return "yes"
}

// Verdicts of a target judged on a paired interval.
const (
	Pass      = "PASS"
	Miss      = "MISS"
	NotJudged = "NOT JUDGED"
)

// Judge judges a paired change ab against a goal: at most limit percent
// (atLeast false: met when the interval's upper end is at or below it) or
// at least limit percent (atLeast true: its lower end at or above it).
// The A/A comparison of the same metric must be valid (AAValid with
// AAMaxHalfWidth), else the verdict is NotJudged with the reason.
func Judge(ab, aa Paired, limit float64, atLeast bool) (verdict, reason string) {
	switch {
	case ab.Pairs < 2:
		return NotJudged, "fewer than 2 A/B pairs"
	case aa.Pairs < 2:
		return NotJudged, "no A/A comparison (fewer than 2 A/A pairs)"
	}
	if why := aa.AAValid(AAMaxHalfWidth); why != "" {
		return NotJudged, why
	}
	if atLeast && ab.Lo >= limit || !atLeast && ab.Hi <= limit {
		return Pass, ""
	}
	return Miss, ""
}

// Side is what one phase of a quad measures: one of the A/A pair's two
// phases, or the A/B pair's A or B.
type Side int

// The sides of a quad.
const (
	SideAA1 Side = iota // the A/A pair's first label
	SideAA2             // the A/A pair's second label
	SideA               // the A/B pair's A (the baseline)
	SideB               // the A/B pair's B (the change)
)

// String is AA1, AA2, A or B.
func (s Side) String() string {
	if s < SideAA1 || s > SideB {
		return fmt.Sprintf("Side(%d)", int(s))
	}
	return [...]string{"AA1", "AA2", "A", "B"}[s]
}

// QuadOrder is the order of quad q's four phases (q counts from 0; a
// bench's round r of four runs, counted from 1, is quad r-1): the A/A pair,
// then the A/B pair. The A/B order alternates every quad (A first in even
// quads), the A/A labels' every two quads (SideAA1 first in quads 0 and 1 of
// every four), so the order repeats every four quads:
//
//	AA1 AA2 A B | AA1 AA2 B A | AA2 AA1 A B | AA2 AA1 B A
//
// Over any four consecutive quads each label and each side is first of its
// pair twice (a linear drift falls on both alike), and each A/A label
// follows A as often as B, and the other label as often as that one
// follows it; A follows B as often as B follows A, and each A/A label as
// often as B does (TestQuadOrder). So what a switch between the A/B
// pair's datapaths leaves behind falls on both A/A labels alike.
// (Reversing both pairs together every other quad, as the benches did
// before, made the first A/A phase after A always SideAA1: a bias of the
// A/A row whenever the phase after a switch differs.)
func QuadOrder(q int) []Side {
	aa := []Side{SideAA1, SideAA2}
	if q%4 >= 2 {
		aa = []Side{SideAA2, SideAA1}
	}
	if q%2 == 1 {
		return append(aa, SideB, SideA)
	}
	return append(aa, SideA, SideB)
}

// Quads are the phases' results of a paired run by side, each in quad
// order: Quads[SideA][i] and Quads[SideB][i] are quad i's A/B pair,
// Quads[SideAA1][i] and Quads[SideAA2][i] its A/A pair.
type Quads[T any] [4][]T

// RunQuads runs n quads of phases in QuadOrder. The A/A pair runs on
// datapath aa (SideA: the baseline in both phases, as bench lab; SideB: the
// change in both, as bench bypass). Before a phase whose datapath (SideA or
// SideB) is not the previous phase's, set puts that datapath in place;
// phase measures one phase of side s.
func RunQuads[T any](n int, aa Side, set func(dp Side) error, phase func(s Side) (T, error)) (Quads[T], error) {
	var out Quads[T]
	if aa != SideA && aa != SideB {
		return out, fmt.Errorf("quads: the A/A pair's datapath is %d, not SideA or SideB", aa)
	}
	cur := Side(-1)
	for q := range n {
		for _, s := range QuadOrder(q) {
			dp := s
			if s == SideAA1 || s == SideAA2 {
				dp = aa
			}
			if dp != cur {
				if err := set(dp); err != nil {
					return out, err
				}
				cur = dp
			}
			r, err := phase(s)
			if err != nil {
				return out, err
			}
			out[s] = append(out[s], r)
		}
	}
	return out, nil
}
