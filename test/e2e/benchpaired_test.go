package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestBenchBypassPaired: the smallest `bench bypass --pairs` run (host-gw,
// 20 quads of 20 ms phases in 5 blocks of 4, each on fresh flows). The bench itself fails when a row did not take
// both paths (nothing bypassed, or nothing paused); here its report must
// have the five rows (same-node and cross-node, TCP and UDP round trips,
// and a cross-node TCP stream), each with a paired interval and an A/A
// interval, per-hook rows of the bypass's programs run in both kinds of
// phase, and the rows of the tasks on the path; nothing is left behind. No timing
// is asserted.
func TestBenchBypassPaired(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cmd := sysexec.Command(context.Background(), labBin, "bench", "bypass", "--pairs", "20", "--blocks", "5", "--phase", "20ms", "--modes", "host-gw")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench bypass --pairs: %v\n%s\n%s", err, stderr.String(), stdout.String())
	}
	out := stdout.String()
	interval := `[+-]\d+\.\d% \[[+-]\d+\.\d, [+-]\d+\.\d\]`
	metric := `((TCP|UDP) RTT p50 \(us\)|TCP stream \(Gbit/s\))`
	row := regexp.MustCompile(`(?m)^\| (same|cross)-node +\| +` + metric + ` \|.*\| +` + interval + ` \| +` + interval + ` \|`)
	if n := len(row.FindAllString(out, -1)); n != 5 {
		t.Errorf("%d paired rows with two intervals, want 5:\n%s", n, out)
	}
	// Each row's progress line gives its blocks' spread; the report, how
	// the interval was made.
	if n := len(regexp.MustCompile(`(?m)^paired .*; blocks' A/B medians [+-]\d+\.\d \.\. [+-]\d+\.\d\)$`).FindAllString(out, -1)); n != 5 || !strings.Contains(out, "in 5 blocks") {
		t.Errorf("%d rows with their blocks' spread (want 5), or no \"in 5 blocks\":\n%s", n, out)
	}
	hook := regexp.MustCompile(`(?m)^\| (same|cross)-node +\| +` + metric + ` \| +ez_bypass \| +([0-9.]+) \| +\d+ \| +([0-9.]+) \|`)
	hooks := hook.FindAllStringSubmatch(out, -1)
	if len(hooks) != 5 {
		t.Errorf("%d per-hook rows of ez_bypass, want 5:\n%s", len(hooks), out)
	}
	for _, h := range hooks {
		if h[4] == "0.00" || h[5] == "0.00" {
			t.Errorf("ez_bypass did not run in both kinds of phase: %q", h[0])
		}
	}
	checkPathTasks(t, out, metric, 5)
	assertClean(t, "bbp", "")
	if left, _ := filepath.Glob("/sys/fs/bpf/eztunnel-bench-*"); len(left) > 0 {
		t.Errorf("pins left behind: %s", strings.Join(left, " "))
	}
}
