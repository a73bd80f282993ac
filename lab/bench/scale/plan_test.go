package scale

import (
	"slices"
	"testing"
)

func TestPlanStep(t *testing.T) {
	for _, tc := range []struct {
		n       int
		nofile  uint64
		procs   int
		per     int
		largest int
	}{
		{1000, 20000, 1, 19936, 1000},
		{19936, 20000, 1, 19936, 19936},
		{19937, 20000, 2, 19936, 9969},
		{1000000, 20000, 51, 19936, 19608},
		// A generous limit is capped by the ephemeral ports of one server port.
		{1000000, 1 << 20, 17, maxPerPort, 58824},
		{100, 65, 100, 1, 1},
	} {
		p, err := PlanStep(tc.n, tc.nofile, 7100)
		if err != nil {
			t.Fatalf("PlanStep(%d, %d): %v", tc.n, tc.nofile, err)
		}
		sum := 0
		for i, s := range p.Shares {
			sum += s
			if s > p.PerProc || s > maxPerPort {
				t.Errorf("PlanStep(%d, %d): share %d of %d over %d", tc.n, tc.nofile, i, s, p.PerProc)
			}
			if p.Ports[i] != 7100+i {
				t.Errorf("port %d = %d", i, p.Ports[i])
			}
		}
		if sum != tc.n || p.Procs() != tc.procs || p.PerProc != tc.per || p.Shares[0] != tc.largest {
			t.Errorf("PlanStep(%d, %d) = %d processes of %d (largest share %d, sum %d); want %d of %d (largest %d)",
				tc.n, tc.nofile, p.Procs(), p.PerProc, p.Shares[0], sum, tc.procs, tc.per, tc.largest)
		}
		if slices.Max(p.Shares)-slices.Min(p.Shares) > 1 {
			t.Errorf("PlanStep(%d, %d): uneven shares %v", tc.n, tc.nofile, p.Shares)
		}
	}
	for _, bad := range []struct {
		n      int
		nofile uint64
		port   int
	}{{0, 20000, 7100}, {10, 64, 7100}, {1000000, 100, 7100}, {100, 20000, 80}} {
		if _, err := PlanStep(bad.n, bad.nofile, bad.port); err == nil {
			t.Errorf("PlanStep(%d, %d, %d): no error", bad.n, bad.nofile, bad.port)
		}
	}
}

func TestParseSteps(t *testing.T) {
	got, err := ParseSteps([]string{"1k", "10000", "100k", "1M"})
	if err != nil || !slices.Equal(got, []int{1000, 10000, 100000, 1000000}) {
		t.Errorf("ParseSteps = %v, %v", got, err)
	}
	for _, bad := range [][]string{nil, {"10k", "1k"}, {"x"}, {"1.5k"}, {"-3"}, {"0"}} {
		if _, err := ParseSteps(bad); err == nil {
			t.Errorf("ParseSteps(%q): no error", bad)
		}
	}
}

func TestMarginalBytes(t *testing.T) {
	if per, _ := marginalBytes(nil); per != 0 {
		t.Errorf("no steps: %v", per)
	}
	if per, _ := marginalBytes([]Row{{Conns: 1000, NodeBytesPerConn: 125000}}); per != 0 {
		t.Errorf("a step of 1000 alone: %v, want no estimate", per)
	}
	if per, _ := marginalBytes([]Row{{Conns: 100000, NodeBytesPerConn: 12000}}); per != 12000 {
		t.Errorf("a step of 100000 alone: %v", per)
	}
	// 1k: 125 MB, 100k: 1.2 GB: 10,859 B for each connection more.
	per, _ := marginalBytes([]Row{{Conns: 1000, NodeBytesPerConn: 125000}, {Conns: 100000, NodeBytesPerConn: 12000}})
	if per < 10858 || per > 10859 {
		t.Errorf("marginal = %v, want (1.2e9-1.25e8)/99000", per)
	}
}

func TestPerHolder(t *testing.T) {
	for _, tc := range []struct{ n, total, want int }{{1000, 512, 512}, {100000, 512, 86}, {1000000, 512, 11}, {1000000, 10, 1}} {
		p, err := PlanStep(tc.n, 20000, 7100)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.PerHolder(tc.total); got != tc.want {
			t.Errorf("%d connections, %d at once: %d a holder, want %d", tc.n, tc.total, got, tc.want)
		}
	}
}
