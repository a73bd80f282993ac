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
	"github.com/eztunnel/eztunnel/lab/bench/scale"
)

// TestBenchScale runs one small step of `bench scale` end to end: every
// message of its four rounds comes back exactly, its uninstall finishes,
// and the host is as before: no pin, namespace or link of its lab, and no
// conntrack entry of its subnet (the bench once left 1M ESTABLISHED ones,
// 5 days to live, and wrote nf_conntrack_max back below their count: the
// host dropped every new flow).
func TestBenchScale(t *testing.T) {
	const subnet = "10.77.33." // the bench's lab, "scale" (lab/bench/scale)
	out := filepath.Join(t.TempDir(), "scale.json")
	cmd := sysexec.Command(context.Background(), labBin, "bench", "scale", "--steps", "300", "--probe-n", "300",
		"--probe-quads", "4", "--in-flight", "30", "--idle-window", "1s", "--out", out)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench scale: %v\n%s\n%s", err, stderr.String(), stdout.String())
	}
	assertClean(t, "scale", "/sys/fs/bpf/ezbench-scale")
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep scale.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Agent == "" || rep.Lab == "" {
		t.Errorf("report without the versions measured: agent %q, bench %q", rep.Agent, rep.Lab)
	}
	if len(rep.Steps) != 1 || rep.EndedBy != "" {
		t.Fatalf("want one step, none ended: %+v\n%s", rep, stderr.String())
	}
	s := rep.Steps[0]
	if s.Conns != 300 || !s.Exact || s.Pairs < 300 || len(s.Rounds) != 4 || s.UninstallError != "" || s.ListedEnds < 600 {
		t.Errorf("step: conns %d, exact %v, pairs %d, rounds %d, uninstall error %q, listed %d ends\n%s",
			s.Conns, s.Exact, s.Pairs, len(s.Rounds), s.UninstallError, s.ListedEnds, stderr.String())
	}
	if s.AgentRSS == 0 || s.AgentRSSPeak < s.AgentRSS || s.RTT.P50 <= 0 {
		t.Errorf("agent RSS %d, peak %d, probe p50 %v", s.AgentRSS, s.AgentRSSPeak, s.RTT.P50)
	}
	// The probe's messages are redirected: the agent's sk_msg program runs
	// for them (its run time per message, from the statistics run).
	if s.ProgNs["ez_sc_msg"] <= 0 || s.ProgNsPerMsg <= 0 || len(s.ProgNsRuns) != 40 || len(s.ProgOverGauge) != 40 {
		t.Errorf("programs' ns a message %v (median %v, %d runs, %d over the gauge): want ez_sc_msg's, 40 runs",
			s.ProgNs, s.ProgNsPerMsg, len(s.ProgNsRuns), len(s.ProgOverGauge))
	}
	// The probe's quads: plain TCP against the shortcut and the A/A pair,
	// each with four pairs, and a gauge run beside each plain one (the
	// bench itself fails if a plain or gauge run was redirected, or a
	// shortcut run was not).
	if s.CPUVsPlain.Pairs != 4 || s.CPUAA.Pairs != 4 || len(s.CPUOverGauge) != 4 || len(s.PlainOverGauge) != 4 ||
		s.PlainCPUPerMsg <= 0 || s.GaugeCPUPerMsg <= 0 || len(s.CPUPerMsgRuns) != 12 {
		t.Errorf("probe quads: vs plain %+v, A/A %+v, over gauge %v, plain over gauge %v, plain %v, gauge %v, shortcut runs %d",
			s.CPUVsPlain, s.CPUAA, s.CPUOverGauge, s.PlainOverGauge, s.PlainCPUPerMsg, s.GaugeCPUPerMsg, len(s.CPUPerMsgRuns))
	}
	if !strings.Contains(stdout.String(), "| 300 ") {
		t.Errorf("no row of 300 connections:\n%s", stdout.String())
	}
	ct, err := os.ReadFile("/proc/net/nf_conntrack")
	if os.IsNotExist(err) {
		t.Log("nf_conntrack is not loaded: the bench left no entry")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	var left int
	for _, line := range strings.Split(string(ct), "\n") {
		if strings.Contains(line, "src="+subnet) || strings.Contains(line, "dst="+subnet) {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d conntrack entries of %s0/24 left in the host's table", left, subnet)
	}
}
