package main

import (
	"strings"
	"testing"
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
