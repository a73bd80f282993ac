package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/nodelayout"
	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestRunDirMoved: with --run-dir elsewhere (the chart's lockDir moved),
// the agent's lock, parts report and recent log all go there and nothing
// of this datapath to the default /run/eztunnel; status and bugreport find
// them with the same flag, and uninstall removes them from there. Before
// --run-dir the report and the log went to /run/eztunnel whatever the lock
// file's directory: in a DaemonSet with another lockDir, outside the
// mounted host path (status without parts, bugreport without a log).
func TestRunDirMoved(t *testing.T) {
	e, _, _, pin := agentEnv(t, "rundir", 37)
	dir := t.TempDir()
	moved := nodelayout.Layout{PinRoot: pin, RunDir: dir}
	def := nodelayout.Layout{PinRoot: pin}
	a := startAgent(t, bin, e.lab.Managed, pin, "--run-dir", dir)
	for _, f := range []string{moved.Lock(), moved.Report(), moved.Log()} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the agent's file is not in --run-dir: %v", err)
		}
	}
	for _, f := range []string{def.Lock(), def.Report(), def.Log()} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s exists with --run-dir %s (err %v)", f, dir, err)
		}
	}
	out, err := eztunnel(context.Background(), "status", "--pin-path", pin, "--run-dir", dir)
	if err != nil || !strings.Contains(out, "shortcut") || !strings.Contains(out, "runs") {
		t.Errorf("status --run-dir does not show the agent's parts: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("pid %d, version e2e-build (lock %s)", a.cmd.Process.Pid, moved.Lock()); !strings.Contains(out, want) {
		t.Errorf("status does not name the running agent (%q):\n%s", want, out)
	}
	// The log level while the agent runs: `eztunnel log-level` writes it
	// in --run-dir and signals the lock's holder.
	if out, err := eztunnel(context.Background(), "log-level", "debug", "--pin-path", pin, "--run-dir", dir); err != nil {
		t.Fatalf("log-level: %v\n%s", err, out)
	}
	for deadline := time.Now().Add(scaled(5 * time.Second)); !strings.Contains(a.logs.String(), `msg="log level changed" level=DEBUG`); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not take the log level:\n%s", a.logs.String())
		}
	}
	if _, err := os.Stat(moved.LogLevel()); err != nil {
		t.Errorf("the level is not in --run-dir: %v", err)
	}
	file := filepath.Join(t.TempDir(), "br.tar.gz")
	if out, err := eztunnel(context.Background(), "bugreport", "--pin-path", pin, "--run-dir", dir, "-f", file); err != nil {
		t.Fatalf("bugreport: %v\n%s", err, out)
	}
	log, err := sysexec.Command(context.Background(), "tar", "-xzOf", file, "eztunnel-bugreport/agent.log").CombinedOutput()
	if err != nil || !strings.Contains(string(log), "datapath attached") {
		t.Errorf("bugreport --run-dir has not the agent's log: %v\n%.400s", err, log)
	}
	a.cmd.Process.Signal(syscall.SIGTERM)
	a.cmd.Wait()
	if out, err := eztunnel(context.Background(), "status", "--pin-path", pin, "--run-dir", dir); err != nil || !strings.Contains(out, "agent  ") || !strings.Contains(out, "none: the pinned datapath works on its own") {
		t.Errorf("status with the agent stopped: %v\n%s", err, out)
	}
	if out, err := eztunnel(context.Background(), "uninstall", "--pin-path", pin, "--run-dir", dir); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	for _, f := range []string{moved.Report(), moved.Log(), moved.LogLevel()} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("uninstall --run-dir left %s (err %v)", f, err)
		}
	}
}
