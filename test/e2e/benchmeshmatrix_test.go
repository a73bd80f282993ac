package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestBenchMeshMatrixPaired: the smallest `bench mesh-matrix --pairs` run
// (host-gw, 20 quads of 10 ms phases per comparison, one integrity probe
// per page). The bench itself fails when a comparison did not take both
// paths (nothing bypassed or nothing paused; fewer connections paired or
// excluded than its phases opened). Here its report must have the two
// rows, the bypass and the shortcut on the client leg, each with a paired
// interval, an A/A interval and a judged cell; per-hook rows where the
// bypass's ez_bypass ran in both kinds of phase and the shortcut's sk_msg
// program ran more often per request with the client leg taken than
// excluded; nothing is left behind. No timing is asserted.
func TestBenchMeshMatrixPaired(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := sysexec.Command(context.Background(), labBin, "bench", "mesh-matrix", "--pairs", "20", "--phase", "10ms",
		"--modes", "host-gw", "--probes", "1")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench mesh-matrix --pairs: %v\n%s\n%s", err, stderr.String(), stdout.String())
	}
	out := stdout.String()
	interval := `[+-]\d+\.\d% \[[+-]\d+\.\d, [+-]\d+\.\d\]`
	cmp := `(bypass \(cross-node legs\)|shortcut \(client leg\))`
	row := regexp.MustCompile(`(?m)^\| ` + cmp + ` +\|.*\| +[0-9.]+ \| +[0-9.]+ \| +` + interval + ` \| +` + interval + ` \| +(yes|no: [^|]+) \|$`)
	if n := len(row.FindAllString(out, -1)); n != 2 {
		t.Errorf("%d paired rows with two intervals and a judged cell, want 2:\n%s", n, out)
	}
	hook := func(c, prog string) (a, b float64) {
		t.Helper()
		re := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(c) + ` +\| +` + prog + ` \| +([0-9.]+) \| +\d+ \| +([0-9.]+) \|`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Errorf("no per-hook row of %s for %s:\n%s", prog, c, out)
			return 0, 0
		}
		a, _ = strconv.ParseFloat(m[1], 64)
		b, _ = strconv.ParseFloat(m[2], 64)
		return a, b
	}
	if a, b := hook("bypass (cross-node legs)", "ez_bypass"); a == 0 || b == 0 {
		t.Errorf("ez_bypass ran %v and %v times per request: not in both kinds of phase", a, b)
	}
	if a, b := hook("shortcut (client leg)", "ez_sc_msg"); a >= b {
		t.Errorf("ez_sc_msg ran %v times per request with the client leg excluded, %v with it taken: want fewer excluded", a, b)
	}
	assertClean(t, "bmm", "")
	if left, _ := filepath.Glob("/sys/fs/bpf/eztunnel-meshmatrix-*"); len(left) > 0 {
		t.Errorf("pins left behind: %s", strings.Join(left, " "))
	}
}
