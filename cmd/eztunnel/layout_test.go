package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cli"
)

// TestLayoutEnv: in the agent's pod the chart sets where the agent pins
// and keeps its files as EZTUNNEL_PIN_PATH, EZTUNNEL_RUN_DIR and
// EZTUNNEL_LOCK_FILE; a command exec'd there reads those places.
func TestLayoutEnv(t *testing.T) {
	t.Setenv("EZTUNNEL_PIN_PATH", "/sys/fs/bpf/eztest-layout-env")
	t.Setenv("EZTUNNEL_RUN_DIR", t.TempDir())
	t.Setenv("EZTUNNEL_LOCK_FILE", "/nonexistent/agent.lock")
	root := cli.Root("eztunnel", "", "", "test", versionCmd())
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"version"})
	err := root.Execute()
	if !strings.Contains(out.String()+errString(err), "/nonexistent/agent.lock") || !strings.Contains(out.String()+errString(err), "eztest-layout-env") {
		t.Errorf("version did not read the environment's places: %v\n%s", err, out.String())
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
