package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench/hops"
)

// TestBenchHops runs `bench hops` once, short, on the sidecar chain: one
// run of each datapath in the report, each datapath really taken (the
// naive sockmap's and eztunnel's counters say they redirected, about two
// messages per hop and round trip; plain TCP loaded nothing), their
// programs' statistics read, and nothing left behind. Never timings.
func TestBenchHops(t *testing.T) {
	out := filepath.Join(t.TempDir(), "hops.json")
	cmd := sysexec.Command(context.Background(), labBin, "bench", "hops", "--mesh", "sidecar", "--rounds", "1",
		"--ping-n", "200", "--lab-name", "hp1", "--subnet", "71", "--pin-path", "/sys/fs/bpf/ezhp1", "--json", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench hops: %v\n%s\n%s", err, stderr.String(), stdout.String())
	}
	assertClean(t, "hp1", "/sys/fs/bpf/ezhp1")
	for _, want := range []string{"| plain ", "| naive ", "| eztunnel ", "ez_naive_msg", "not in program time"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, stdout.String())
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res hops.Result
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != len(hops.Datapaths) {
		t.Fatalf("%d runs, want %d: %+v", len(res.Runs), len(hops.Datapaths), res.Runs)
	}
	// The sidecar chain has three hops: each round trip is six messages,
	// two per hop (a few go the kernel path while a connection opens).
	for _, r := range res.Runs {
		if r.P50 <= 0 || r.RoundTrips <= 0 {
			t.Errorf("%s: p50 %v, round trips %d", r.Datapath, r.P50, r.RoundTrips)
		}
		perRT := float64(hops.Redirected(r)) / float64(2*r.RoundTrips)
		var msgRuns uint64
		for name, st := range r.Progs {
			if strings.HasSuffix(name, "_msg") {
				msgRuns += st.Runs
			}
		}
		switch r.Datapath {
		case hops.Plain:
			if len(r.Progs) != 0 || len(r.Counters) != 0 {
				t.Errorf("plain TCP ran programs %v, counters %v", r.Progs, r.Counters)
			}
		case hops.Naive, hops.Eztunnel:
			if perRT < 5 || perRT > 6.5 {
				t.Errorf("%s: %.2f messages redirected per round trip, want about 6 (counters %v)", r.Datapath, perRT, r.Counters)
			}
			if msgRuns < uint64(5*r.RoundTrips) {
				t.Errorf("%s: sk_msg ran %d times over %d round trips (programs %v)", r.Datapath, msgRuns, r.RoundTrips, r.Progs)
			}
		}
	}
}
