package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// cgroupPins lists the cgroup ids with links pinned under pin.
func cgroupPins(t *testing.T, pin string) []string {
	t.Helper()
	entries, err := os.ReadDir(bpfsys.LinkPin(filepath.Join(pin, datapath.Schema), bpfsys.KindCgroup))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids
}

// tempCgroup makes an empty cgroup under parent, removed at cleanup if still there.
func tempCgroup(t *testing.T, parent, name string) string {
	t.Helper()
	p := filepath.Join(parent, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(p) })
	return p
}

func stopAgent(t *testing.T, a *agent) {
	t.Helper()
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("agent exit: %v\n%s", err, a.logs.String())
	}
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool, diag func() string) {
	t.Helper()
	within = scaled(within)
	for deadline := time.Now().Add(within); !ok(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s\n%s", what, within, diag())
		}
	}
}

// TestAgentConvergesCgroups: what is attached and pinned always converges to
// the --cgroup flags of the running agent: at startup (a cgroup the previous
// agent managed, and one removed while no agent ran, are detached and
// unpinned) and while it runs (a managed cgroup removed, then made again).
func TestAgentConvergesCgroups(t *testing.T) {
	e := newEnv(t, "conv", 32)
	pin := e.pin("/sys/fs/bpf/eztest-conv")
	t.Cleanup(func() { eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
	gone := tempCgroup(t, e.lab.Unmanaged, "gone")
	goneID := strconv.FormatUint(cgroupID(t, gone), 10)
	managedID := strconv.FormatUint(cgroupID(t, e.lab.Managed), 10)

	first := startAgent(t, bin, e.lab.Managed, pin, "--cgroup", gone)
	if n := attachedPrograms(t, gone); n != 2 {
		t.Fatalf("%d programs on %s, want 2", n, gone)
	}
	stopAgent(t, first)
	if err := os.Remove(gone); err != nil { // removed while no agent runs
		t.Fatal(err)
	}

	// Restart with another cgroup: the old one and the removed one go.
	second := startAgent(t, bin, e.lab.Unmanaged, pin)
	if n := attachedPrograms(t, e.lab.Managed); n != 0 {
		t.Errorf("%d programs left on %s, which the running agent does not manage", n, e.lab.Managed)
	}
	if n := attachedPrograms(t, e.lab.Unmanaged); n != 2 {
		t.Errorf("%d programs on %s, want 2", n, e.lab.Unmanaged)
	}
	if ids := cgroupPins(t, pin); len(ids) != 1 || ids[0] == managedID || ids[0] == goneID {
		t.Errorf("cgroup link pins %v, want only %s's (old %s, removed %s)", ids, e.lab.Unmanaged, managedID, goneID)
	}
	if !strings.Contains(second.logs.String(), "detached cgroups no longer managed") {
		t.Errorf("the agent did not log what it detached:\n%s", second.logs.String())
	}
	stopAgent(t, second)

	// While it runs: a managed cgroup removed is unpinned within a second or
	// two; made again (a new cgroup id), it is attached again.
	later := tempCgroup(t, e.lab.Unmanaged, "later")
	third := startAgent(t, bin, e.lab.Unmanaged, pin, "--cgroup", later)
	laterID := strconv.FormatUint(cgroupID(t, later), 10)
	has := func(id string) bool {
		for _, got := range cgroupPins(t, pin) {
			if got == id {
				return true
			}
		}
		return false
	}
	if !has(laterID) {
		t.Fatalf("no pins for %s: %v", later, cgroupPins(t, pin))
	}
	if err := os.Remove(later); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed cgroup's links unpinned", 15*time.Second, func() bool { return !has(laterID) }, third.logs.String)
	if err := os.Mkdir(later, 0o755); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-made cgroup attached", 15*time.Second, func() bool { return attachedPrograms(t, later) == 2 }, third.logs.String)
	stopAgent(t, third)
}

// TestOneAgentPerDatapath: a second agent on the same pins refuses, naming
// the first; with --takeover (a DaemonSet update with maxSurge: same host
// ports) the first hands over, frees the health port and stands by, alive,
// and the second serves health and accelerates new connections.
// `uninstall` takes over from a running agent the same way, so the agent
// cannot put back what uninstall removes.
func TestOneAgentPerDatapath(t *testing.T) {
	e, a, b, pin := agentEnv(t, "lock", 33)
	const health = "127.0.0.1:19871"
	first := startAgent(t, bin, e.lab.Managed, pin, "--health-addr", health)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + health + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	waitFor(t, "first agent ready", 15*time.Second, func() bool { code, _ := get("/readyz"); return code == 200 }, first.logs.String)

	out, err := eztunnelOut("run", "--cgroup", e.lab.Managed, "--pin-path", pin, "--health-addr", health)
	if err == nil || !strings.Contains(out, "another eztunnel agent") || !strings.Contains(out, "--takeover") {
		t.Fatalf("second agent without --takeover: %v\n%s", err, out)
	}
	if first.cmd.ProcessState != nil {
		t.Fatal("the first agent exited")
	}

	second := startAgent(t, bin, e.lab.Managed, pin, "--takeover", "--health-addr", health)
	waitFor(t, "the first agent handing over", 15*time.Second, func() bool {
		return strings.Contains(first.logs.String(), "handing the datapath over")
	}, first.logs.String)
	waitFor(t, "the second agent serving health on the same port", 15*time.Second, func() bool {
		code, _ := get("/readyz")
		return code == 200 && strings.Contains(second.logs.String(), "serving health")
	}, second.logs.String)
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz after the handover: %d", code)
	}
	if first.cmd.ProcessState != nil {
		t.Fatal("the first agent exited instead of standing by")
	}
	before := pinnedCounters(t, pin)
	if out, err := e.run(a, streamCase{conns: 5, parallel: 5, up: 1 << 20, down: 1 << 20, chunk: 65536}.args(hostport(b.IPv4, 7000), 3)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	requirePaired(t, delta(before, pinnedCounters(t, pin)), 5, 1, "connections after the handover")

	// uninstall under a running agent: the agent stands down first and does
	// not re-attach what uninstall removed.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := sysexec.Command(ctx, bin, "uninstall", "--pin-path", pin).CombinedOutput(); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	time.Sleep(2500 * time.Millisecond) // more than two reconcile periods
	assertRemoved(t, e.lab.Managed, pin)
	if !strings.Contains(second.logs.String(), "handing the datapath over") {
		t.Errorf("the running agent did not stand down for uninstall:\n%s", second.logs.String())
	}
	stopAgent(t, second)
	stopAgent(t, first)
}
