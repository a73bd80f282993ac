package bench

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"gonum.org/v1/gonum/stat/distuv"
)

// simRuns are runs of 10 blocks of 20 pairs around A = 100 whose B is
// effect[i] percent off in run i, with noise of sd percent per pair.
func simRuns(seed uint64, sd float64, effect ...float64) []RunPhases {
	r := rand.New(rand.NewPCG(seed, 1))
	var runs []RunPhases
	for i, e := range effect {
		rp := RunPhases{Seed: uint64(i + 1)}
		for range 10 {
			var a, b []float64
			for range 20 {
				a = append(a, 100)
				b = append(b, 100+e+sd*r.NormFloat64())
			}
			rp.A, rp.B = append(rp.A, a), append(rp.B, b)
		}
		runs = append(runs, rp)
	}
	return runs
}

// TestPoolRunsApart: three runs whose effects differ by 2 points, each
// measured to within a few tenths, do not agree; the pooled estimate is
// their middle, the spread between them is Tau, and the pooled interval
// spans all three (a claim across the host's states).
func TestPoolRunsApart(t *testing.T) {
	p, err := PoolRuns(simRuns(7, 1, -10, -12, -14))
	if err != nil {
		t.Fatal(err)
	}
	if p.Agree {
		t.Errorf("runs %v agree", p.Runs)
	}
	if math.Abs(p.Median+12) > 0.3 || math.Abs(p.Tau-2) > 0.3 || p.I2 < 0.9 {
		t.Errorf("pooled %+.2f, tau %.2f, I2 %.2f; want -12, 2, above 0.9", p.Median, p.Tau, p.I2)
	}
	if p.Lo > -14 || p.Hi < -10 {
		t.Errorf("pooled interval [%.2f, %.2f] does not span the runs -10 .. -14", p.Lo, p.Hi)
	}
	if got := p.Paired(); got.Pairs != 600 || got.Blocks != 30 {
		t.Errorf("pooled as one comparison: %d pairs, %d blocks; want 600, 30", got.Pairs, got.Blocks)
	}
}

// TestPoolRunsTogether: runs of one effect agree, and nothing is left
// between them.
func TestPoolRunsTogether(t *testing.T) {
	p, err := PoolRuns(simRuns(8, 1, -12, -12, -12))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Agree || p.Tau > 0.2 || p.Lo > -12 || p.Hi < -12 || p.Hi-p.Lo > 2 {
		t.Errorf("agree %v, tau %.2f, pooled %+.2f [%.2f, %.2f]; want agreement, tau about 0 and an interval holding -12 within ±1", p.Agree, p.Tau, p.Median, p.Lo, p.Hi)
	}
}

func TestPoolRunsRefused(t *testing.T) {
	if _, err := PoolRuns(simRuns(9, 1, -12)); err == nil {
		t.Error("one run pooled")
	}
	if _, err := PoolRuns(simRuns(9, 0, -12, -13)); err == nil {
		t.Error("runs without any spread pooled (zero standard errors)")
	}
	few := simRuns(9, 1, -12, -13)
	few[1].A, few[1].B = few[1].A[:MinPoolBlocks-1], few[1].B[:MinPoolBlocks-1]
	if _, err := PoolRuns(few); err == nil || !strings.Contains(err.Error(), "run 2 has 4 block(s)") {
		t.Errorf("a run of %d blocks pooled: %v", MinPoolBlocks-1, err)
	}
}

// TestRandomEffectsCoverage: three runs whose true effect moves between
// runs (sd 2 points) and each measured to 0.3 points: an interval from one
// run holds the mean effect in few of them, the pooled interval in about
// 95% (the Hartung-Knapp interval with its floor is conservative).
func TestRandomEffectsCoverage(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const sims, se, tau = 2000, 0.3, 2.0
	z := distuv.UnitNormal.Quantile(0.975)
	var pooled, single int
	for range sims {
		est, v := make([]float64, 3), make([]float64, 3)
		for i := range est {
			est[i] = tau*r.NormFloat64() + se*r.NormFloat64()
			v[i] = se * se
		}
		if _, lo, hi, _, _ := randomEffects(est, v); lo <= 0 && 0 <= hi {
			pooled++
		}
		if math.Abs(est[0]) <= z*se {
			single++
		}
	}
	pc, sc := float64(pooled)/sims, float64(single)/sims
	t.Logf("coverage of the mean effect: pooled %.3f, one run's own interval %.3f", pc, sc)
	if pc < 0.93 || sc > 0.5 {
		t.Errorf("coverage: pooled %.3f (want at least 0.93), one run %.3f (want below 0.5)", pc, sc)
	}
}
