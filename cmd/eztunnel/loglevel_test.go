package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/agentlock"
)

// TestLogLevelOnlyToAnAgent: the lock's holder here is this test, which
// does not say it takes SIGUSR2 (whose default action would end it, as it
// would an agent older than log-level): nothing is sent, and the error
// says why. A level that does not parse is a usage error.
func TestLogLevelOnlyToAnAgent(t *testing.T) {
	lockFile := filepath.Join(t.TempDir(), "agent.lock")
	lock, err := agentlock.Acquire(lockFile, "a test", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	run := func(args ...string) error {
		cmd := logLevelCmd()
		cmd.SetArgs(append(args, "--lock-file", lockFile, "--run-dir", t.TempDir()))
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		return cmd.Execute()
	}
	if err := run("debug"); err == nil || !strings.Contains(err.Error(), "does not take SIGUSR2") {
		t.Errorf("log-level to a holder without SIGUSR2: %v", err)
	}
	if err := run("loud"); exitCode(err) != exitUsage {
		t.Errorf("log-level loud: %v (exit %d), want a usage error", err, exitCode(err))
	}
}
