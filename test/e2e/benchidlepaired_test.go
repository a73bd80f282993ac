package e2e

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestBenchBypassIdlePaired: the smallest `bench bypass --pairs --pair idle`
// run (host-gw, same-node only, 20 quads of 10 ms phases: a switch takes
// about 0.1 s, and a row has 40): the idle agent against no agent,
// both nodes' agents' links detached and attached again in place. The
// bench itself fails when a program of the links ran in a phase with the
// links detached, or none ran with them attached, and when the links are
// not as the agents left them at the end; here its report must have the
// two rows (TCP and UDP round trips), each with a paired interval and an
// A/A interval, per-hook rows whose runs with the links detached are 0 and
// with them attached not all 0, and say the links are as they were. A
// second run is interrupted once it holds the links, in its first row: it
// too must leave the links as they were. Then the same with --pair
// idle-narrow (the node-wide hooks refused): neither the read tracepoint
// nor a splice-guard program may run. Last --pair idle-narrow
// --switch-links close_reset: only the close reset's links are switched,
// so it runs in B only, while cgroup egress, attached on both sides, runs
// in A too. Last --pair idle-unselected: the agents select a bystander
// pod each and attach the close reset only to covered devices, so on the
// measured pods' paths cgroup egress runs and the close reset never does;
// its quads run in 5 blocks, and --raw's phases give the intervals it
// printed; then with only the close reset's links switched, which never
// run on those paths, and a clsact qdisc on each node's loopback.
// Nothing is left behind. No timing is asserted.
func TestBenchBypassIdlePaired(t *testing.T) {
	args, _ := idlePairedRun(t, "idle")
	assertClean(t, "bbp", "")
	interrupted(t, args)
	assertClean(t, "bbp", "")
	// What the idle agent costs where the host allows fentry and fexit:
	// the node-wide hooks refused, so none may be among the hooks.
	idlePairedRun(t, "idle-narrow")
	assertClean(t, "bbp", "")
	idlePairedRun(t, "idle-narrow", "--switch-links", "close_reset")
	assertClean(t, "bbp", "")
	// The pods of the paths are not selected: the close reset is on the
	// selected bystander pods' devices only, so it never runs on them. In
	// 5 blocks, each on fresh flows, with every phase written to --raw.
	raw := filepath.Join(t.TempDir(), "phases.csv")
	_, out := idlePairedRun(t, "idle-unselected", "--blocks", "5", "--raw", raw)
	checkRawPhases(t, raw, out, "idle-unselected", "ipv4 phase=10ms", 2, 5)
	if !strings.Contains(out, "in 5 blocks") {
		t.Errorf("the report does not say the quads ran in 5 blocks:\n%s", out)
	}
	assertClean(t, "bbp", "")
	// Links whose programs never run on the measured paths can be
	// switched alone: the bench proves each detach by the link's ID. With
	// --tc-hooks-on each node's loopback holds a clsact qdisc throughout.
	_, out = idlePairedRun(t, "idle-unselected", "--switch-links", "close_reset", "--tc-hooks-on")
	if n := len(regexp.MustCompile(`(?m)^n\d: a clsact qdisc on lo \(--tc-hooks-on\)`).FindAllString(out, -1)); n != 2 {
		t.Errorf("--tc-hooks-on: %d nodes say they hold a clsact qdisc on lo, want 2:\n%s", n, out)
	}
	assertClean(t, "bbp", "")
	if left, _ := filepath.Glob("/sys/fs/bpf/eztunnel-bench-*"); len(left) > 0 {
		t.Errorf("pins left behind: %s", strings.Join(left, " "))
	}
}

// idlePairedRun runs the smallest paired run of --pair pair (and extra
// options: with --switch-links, only the close reset's links), checks its
// report, and returns its arguments and the report.
func idlePairedRun(t *testing.T, pair string, extra ...string) (args []string, out string) {
	t.Helper()
	args = append([]string{"bench", "bypass", "--pairs", "20", "--phase", "10ms", "--modes", "host-gw", "--pair", pair, "--paths", "same-node"}, extra...)
	subset := slices.Contains(extra, "--switch-links")
	var stdout, stderr bytes.Buffer
	cmd := sysexec.Command(context.Background(), labBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("bench bypass --pairs --pair %s: %v\n%s\n%s", pair, err, stderr.String(), stdout.String())
	}
	out = stdout.String()
	held := regexp.MustCompile(`(?m)^n\d: the bench holds the stopped agent's (\d+) links`).FindAllStringSubmatch(out, -1)
	if len(held) != 2 || held[0][1] == "0" || held[1][1] == "0" {
		t.Errorf("want both nodes' agents' links held: %q\n%s", held, out)
	}
	interval := `[+-]\d+\.\d% \[[+-]\d+\.\d, [+-]\d+\.\d\]`
	metric := `((TCP|UDP) RTT p50 \(us\))`
	row := regexp.MustCompile(`(?m)^\| (same|cross)-node +\| +` + metric + ` \|.*\| +` + interval + ` \| +` + interval + ` \|`)
	if n := len(row.FindAllString(out, -1)); n != 2 {
		t.Errorf("%d paired rows with two intervals, want 2:\n%s", n, out)
	}
	hook := regexp.MustCompile(`(?m)^\| (same|cross)-node +\| +` + metric + ` \| +(ez_\w+) +\| +([0-9.]+) \| +([0-9.]+) \|`)
	hooks := hook.FindAllStringSubmatch(out, -1)
	ran, progs, attached := map[string]float64{}, map[string]bool{}, map[string]float64{}
	for _, h := range hooks {
		switch {
		case subset && h[4] == "ez_sc_egress" && h[5] == "0.00":
			t.Errorf("--switch-links close_reset: cgroup egress, attached on both sides, did not run in A: %q", h[0])
		case (!subset || h[4] == "ez_sc_close_reset") && h[5] != "0.00":
			t.Errorf("%s ran with the links detached: %q", h[4], h[0])
		}
		v, _ := strconv.ParseFloat(h[6], 64)
		ran[h[1]+h[2]] += v
		progs[h[4]] = true
		attached[h[4]] += v
	}
	if len(ran) != 2 {
		t.Errorf("per-hook rows for %d of the 2 rows:\n%s", len(ran), out)
	}
	for r, v := range ran {
		if v == 0 {
			t.Errorf("%s: no program ran with the links attached:\n%s", r, out)
		}
	}
	if n := regexp.MustCompile(`(?m)^\| (same|cross)-node +\| +`+metric+` \| +all programs +\|`).FindAllString(out, -1); len(n) != 2 {
		t.Errorf("%d 'all programs' rows, want 2:\n%s", len(n), out)
	}
	if !strings.Contains(out, "the agents' links are as they were") {
		t.Errorf("no word that the links are as they were:\n%s", out)
	}
	checkPathTasks(t, out, metric, 2)
	if subset {
		sw := regexp.MustCompile(`(?m)^  switched \(--switch-links close_reset\): (\S+)$`).FindAllStringSubmatch(out, -1)
		if len(sw) == 0 || !progs["ez_sc_close_reset"] || !progs["ez_sc_egress"] {
			t.Errorf("--switch-links close_reset: switched %q, hooks %v:\n%s", sw, progs, out)
		}
		for _, l := range sw {
			if !strings.Contains(l[1], "ez_sc_close_reset_") {
				t.Errorf("--switch-links close_reset switched %s", l[1])
			}
		}
		return args, out
	}
	if pair == "idle-unselected" && (attached["ez_sc_close_reset"] != 0 || attached["ez_sc_egress"] == 0 ||
		len(regexp.MustCompile(`(?m)^n\d: the agent selects pod yn\d `).FindAllString(out, -1)) != 2) {
		t.Errorf("--pair idle-unselected: want the close reset never run on the measured paths, cgroup egress run, and a bystander pod selected on each node:\n%s", out)
	}
	// (With --pair idle it runs only where fexit is refused, as here.)
	if (pair == "idle-narrow" || pair == "idle-unselected") && (progs["ez_sc_recv"] || progs["ez_sc_splice_tp"] || progs["ez_sc_sendfile_tp"] || progs["ez_sc_splice"] ||
		!strings.Contains(out, "B is the idle agent with ") || !strings.Contains(out, "no hook of it runs for the whole node")) {
		t.Errorf("--pair idle-narrow: a node-wide hook ran, or the report does not say they were refused:\n%s", out)
	}
	return args, out
}

// interrupted runs the bench with args and interrupts it once it holds
// both agents' links: it must fail, and say the links are as they were.
func interrupted(t *testing.T, args []string) {
	t.Helper()
	cmd := sysexec.Command(context.Background(), labBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if strings.HasPrefix(sc.Text(), "n2: the bench holds") {
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Error(err)
			}
			break
		}
	}
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
	}
	err = cmd.Wait()
	if err == nil {
		t.Errorf("the interrupted bench did not fail:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "the agents' links are as they were") {
		t.Errorf("interrupted: no word that the links are as they were:\n%s\n%s", out.String(), stderr.String())
	}
}

// checkPathTasks checks the report's table of the tasks on the path: per
// row (there are rows of metric) the client thread, the server pod and the
// softirq threads, each with six numbers; the first two ran in both kinds
// of phase.
func checkPathTasks(t *testing.T, out, metric string, rows int) {
	t.Helper()
	tasks := regexp.MustCompile(`(?m)^\| (same|cross)-node +\| +`+metric+` \| +(client \(the measuring thread\)|server pod \(its threads\)|softirq threads \(ksoftirqd/N\)) \| +([0-9.]+) \| +([0-9.]+) \|( +[0-9.]+ \|){4}$`).FindAllStringSubmatch(out, -1)
	if len(tasks) != 3*rows {
		t.Errorf("%d rows of the path's tasks, want %d:\n%s", len(tasks), 3*rows, out)
	}
	for _, r := range tasks {
		task, a, b := r[len(r)-4], r[len(r)-3], r[len(r)-2]
		if !strings.HasPrefix(task, "softirq") && (a == "0.0" || b == "0.0") {
			t.Errorf("%s had no timeslice in a kind of phase: %q", task, r[0])
		}
	}
}
