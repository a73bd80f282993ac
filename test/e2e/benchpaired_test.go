package e2e

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
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
	raw := filepath.Join(t.TempDir(), "phases.csv")
	cmd := sysexec.Command(context.Background(), labBin, "bench", "bypass", "--pairs", "20", "--blocks", "5", "--phase", "20ms", "--modes", "host-gw", "--raw", raw)
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
	checkRawPhases(t, raw, out, "bypass", "ipv4 phase=20ms", 5, 5)
	assertClean(t, "bbp", "")
	if left, _ := filepath.Glob("/sys/fs/bpf/eztunnel-bench-*"); len(left) > 0 {
		t.Errorf("pins left behind: %s", strings.Join(left, " "))
	}
}

// checkRawPhases: --raw wrote every phase of a run of --pair pair in
// setup (rows rows, blocks blocks of 20/blocks quads, 4 phases each), and
// each row's A/B and A/A intervals recomputed from those phases are the
// ones its progress line printed.
func checkRawPhases(t *testing.T, path, out, pair, setup string, rows, blocks int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("--raw: %v", err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("--raw: %v", err)
	}
	if len(recs) != 1+rows*20*4 || strings.Join(recs[0], ",") != "pair,setup,mode,path,metric,block,quad,side,value" {
		t.Fatalf("--raw: %d lines (want the header and %d), header %q", len(recs), rows*20*4, recs[0])
	}
	type rowKey struct{ path, metric string }
	sides := map[string]bench.Side{"AA1": bench.SideAA1, "AA2": bench.SideAA2, "A": bench.SideA, "B": bench.SideB}
	phases := map[rowKey]*[4][][]float64{}
	var order []rowKey
	for _, r := range recs[1:] {
		k := rowKey{r[3], r[4]}
		if phases[k] == nil {
			phases[k] = &[4][][]float64{}
			order = append(order, k)
		}
		blk, err1 := strconv.Atoi(r[5])
		v, err2 := strconv.ParseFloat(r[8], 64)
		s, ok := sides[r[7]]
		if r[0] != pair || r[1] != setup || r[2] != "host-gw" || err1 != nil || err2 != nil || !ok || v <= 0 || blk >= blocks {
			t.Fatalf("--raw line %q", r)
		}
		q := phases[k]
		for len(q[s]) <= blk {
			q[s] = append(q[s], nil)
		}
		q[s][blk] = append(q[s][blk], v)
	}
	names := map[string]string{"tcp-rtt-us": "TCP RTT p50 (us)", "udp-rtt-us": "UDP RTT p50 (us)", "tcp-stream-gbps": "TCP stream (Gbit/s)"}
	if len(order) != rows {
		t.Fatalf("--raw: %d rows, want %d", len(order), rows)
	}
	for _, k := range order {
		q := phases[k]
		if len(q[bench.SideA]) != blocks {
			t.Errorf("%v: %d blocks, want %d", k, len(q[bench.SideA]), blocks)
		}
		n := 0
		for _, b := range q[bench.SideAA1] {
			n += len(b)
		}
		ab, err1 := bench.ComparePairedBlocks(q[bench.SideA], q[bench.SideB], uint64(n))
		aa, err2 := bench.ComparePairedBlocks(q[bench.SideAA1], q[bench.SideAA2], uint64(n))
		if err1 != nil || err2 != nil {
			t.Fatalf("%v: %v %v", k, err1, err2)
		}
		line := regexp.MustCompile(`(?m)^paired ` + regexp.QuoteMeta(k.path) + ` +` + regexp.QuoteMeta(names[k.metric]) + ` +A/B (.*?)  A/A (.*?)  \(`).FindStringSubmatch(out)
		if line == nil || line[1] != ab.String() || line[2] != aa.String() {
			t.Errorf("%v: recomputed from --raw A/B %s, A/A %s; printed %q", k, ab, aa, line)
		}
	}
}
