package bench

import (
	"math/rand/v2"
	"testing"
)

// TestComparePairedByHand: three pairs, differences +10%, +20%, -10%:
// the median is +10% and every bootstrap median is one of them.
func TestComparePairedByHand(t *testing.T) {
	p, err := ComparePaired([]float64{100, 50, 10}, []float64{110, 60, 9}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if p.Pairs != 3 || p.Median != 10 {
		t.Fatalf("got %+v, want 3 pairs, median +10", p)
	}
	if p.Lo < -10 || p.Hi > 20 || p.Lo > p.Median || p.Hi < p.Median {
		t.Fatalf("interval [%v, %v] outside the differences or not around the median", p.Lo, p.Hi)
	}
	if _, err := ComparePaired([]float64{1}, []float64{1, 2}, 1); err == nil {
		t.Fatal("unequal sides accepted")
	}
	if _, err := ComparePaired([]float64{0, 1}, []float64{1, 2}, 1); err == nil {
		t.Fatal("a zero A phase accepted")
	}
}

// TestComparePairedFindsShiftUnderDrift: B is 10% below A, both ride a
// drift of +-30% (the host) and 5% noise per phase: the paired interval
// holds -10 and not 0 and is within +-2 points; an A/A comparison of the
// same kind holds 0 and is accepted; an A/A with a 3% offset is refused.
func TestComparePairedFindsShiftUnderDrift(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	const pairs = 200
	var a, b, a2 []float64
	for i := range pairs {
		drift := 1 + 0.3*float64(i%40-20)/20 // slow saw between 0.7 and 1.3
		noise := func() float64 { return 1 + 0.05*r.NormFloat64() }
		a = append(a, 50*drift*noise())
		b = append(b, 45*drift*noise())
		a2 = append(a2, 50*drift*noise())
	}
	ab, err := ComparePaired(a, b, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !ab.Contains(-10) || ab.Contains(0) || ab.Width() > 2 {
		t.Fatalf("A/B %s: want an interval holding -10, not 0, within +-2", ab)
	}
	aa, err := ComparePaired(a, a2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if why := aa.AAValid(2); why != "" {
		t.Fatalf("A/A: %s", why)
	}
	// The check that an A/A row can refuse: a constant 3% offset.
	off := make([]float64, pairs)
	for i := range a {
		off[i] = a2[i] * 1.03
	}
	bad, err := ComparePaired(a, off, 1)
	if err != nil {
		t.Fatal(err)
	}
	if bad.AAValid(2) == "" {
		t.Fatalf("A/A %s with a 3%% offset was accepted", bad)
	}
	// Same seed, same interval: a report can be recomputed.
	again, _ := ComparePaired(a, b, 1)
	if again != ab {
		t.Fatalf("not reproducible: %s then %s", ab, again)
	}
}

// TestJudge: a target is judged on the end of the interval nearer to
// missing it, and only when the A/A interval holds 0 within ±2%.
func TestJudge(t *testing.T) {
	aa := Paired{Pairs: 6, Median: 0.2, Lo: -1, Hi: 1.5}
	for _, c := range []struct {
		name    string
		ab, aa  Paired
		limit   float64
		atLeast bool
		want    string
	}{
		{"upper end below the limit", Paired{Pairs: 6, Median: -55, Lo: -60, Hi: -46}, aa, -45, false, Pass},
		{"upper end at the limit", Paired{Pairs: 6, Median: -55, Lo: -60, Hi: -45}, aa, -45, false, Pass},
		{"median met, upper end not", Paired{Pairs: 6, Median: -50, Lo: -60, Hi: -40}, aa, -45, false, Miss},
		{"lower end above the limit", Paired{Pairs: 6, Median: 90, Lo: 81, Hi: 99}, aa, 80, true, Pass},
		{"lower end below the limit", Paired{Pairs: 6, Median: 90, Lo: 79, Hi: 99}, aa, 80, true, Miss},
		{"A/A without 0", Paired{Pairs: 6, Median: -55, Lo: -60, Hi: -50}, Paired{Pairs: 6, Median: 1, Lo: 0.5, Hi: 1.5}, -45, false, NotJudged},
		{"A/A wider than 2%", Paired{Pairs: 6, Median: -55, Lo: -60, Hi: -50}, Paired{Pairs: 6, Median: 0, Lo: -2.5, Hi: 1}, -45, false, NotJudged},
		{"no A/A", Paired{Pairs: 6, Median: -55, Lo: -60, Hi: -50}, TryPaired(nil, nil, 1), -45, false, NotJudged},
		{"one A/B pair", TryPaired([]float64{1}, []float64{0.5}, 1), aa, -45, false, NotJudged},
	} {
		got, why := Judge(c.ab, c.aa, c.limit, c.atLeast)
		if got != c.want || (got == NotJudged) != (why != "") {
			t.Errorf("%s: %s (%q), want %s", c.name, got, why, c.want)
		}
	}
	if c := TryPaired(nil, nil, 1).Cell(); c != "-" {
		t.Errorf("no pairs: cell %q, want -", c)
	}
}
