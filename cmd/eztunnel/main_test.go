package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"golang.org/x/sys/unix"
)

// Through the real command tree: the variable of a subcommand's flag and of
// a global flag reach the flag, and a bad value fails before the command runs.
func TestRootBindsEnv(t *testing.T) {
	t.Setenv("EZTUNNEL_MAX_SOCKETS", "abc")
	root := newRoot()
	root.SetArgs([]string{"run", "--cgroup", "/nonexistent"})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "EZTUNNEL_MAX_SOCKETS") {
		t.Fatalf("run with EZTUNNEL_MAX_SOCKETS=abc: %v", err)
	}

	t.Setenv("EZTUNNEL_MAX_SOCKETS", "1")
	root = newRoot()
	root.SetArgs([]string{"run", "--cgroup", "/nonexistent"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "max sockets 1") {
		t.Fatalf("EZTUNNEL_MAX_SOCKETS=1 did not reach --max-sockets: %v", err)
	}

	t.Setenv("EZTUNNEL_LOG_LEVEL", "loud")
	root = newRoot()
	root.SetArgs([]string{"run"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Fatalf("EZTUNNEL_LOG_LEVEL=loud: %v", err)
	}
}

// TestExitCodes: the documented exit codes (docs/operating.md, "Troubleshooting by symptom"; docs/host.md), through
// the real command tree where a command line gets there.
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"status", "--bogus"}, exitUsage},
		{[]string{"version", "extra"}, exitUsage},
		{[]string{"run", "--max-sockets", "abc"}, exitUsage},
		{[]string{"status", "--pin-path", "/sys/fs/bpf/eztest-exit-none"}, exitNotInstalled},
		{[]string{"connections", "--pin-path", "/sys/fs/bpf/eztest-exit-none"}, exitNotInstalled},
	} {
		root := newRoot()
		root.SetArgs(c.args)
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		if got := exitCode(root.Execute()); got != c.want {
			t.Errorf("%v: exit %d, want %d", c.args, got, c.want)
		}
	}
	for err, want := range map[error]int{
		fmt.Errorf("load: %w", unix.EPERM):           exitNotPermitted,
		fmt.Errorf("open: %w", unix.EACCES):          exitNotPermitted,
		fmt.Errorf("drain: %w", datapath.ErrPartial): exitPartial,
		errors.New("anything else"):                  exitError,
	} {
		if got := exitCode(err); got != want {
			t.Errorf("%v: exit %d, want %d", err, got, want)
		}
	}
}
