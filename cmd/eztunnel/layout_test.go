package main

import (
	"testing"

	"github.com/spf13/cobra"
)

// TestLayoutEnv: in the agent's pod the chart sets where the agent pins and
// keeps its files; every command exec'd there takes them as its defaults,
// and a flag given still wins.
func TestLayoutEnv(t *testing.T) {
	t.Setenv(envPinPath, "/sys/fs/bpf/custom")
	t.Setenv(envRunDir, "/var/run/ez")
	t.Setenv(envLockFile, "/var/run/ez/agent.lock")
	for _, cmd := range []*cobra.Command{statusCmd(), uninstallCmd(), bugreportCmd(), versionCmd(), connectionsCmd()} {
		f := cmd.Flags()
		for flag, want := range map[string]string{"pin-path": "/sys/fs/bpf/custom", "run-dir": "/var/run/ez", "lock-file": "/var/run/ez/agent.lock"} {
			fl := f.Lookup(flag)
			if fl == nil {
				if flag != "lock-file" {
					t.Errorf("%s has no --%s", cmd.Name(), flag)
				}
				continue
			}
			if fl.DefValue != want {
				t.Errorf("%s --%s defaults to %q, want %q from the environment", cmd.Name(), flag, fl.DefValue, want)
			}
		}
	}
	cmd := statusCmd()
	if err := cmd.Flags().Parse([]string{"--pin-path", "/sys/fs/bpf/other"}); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("pin-path").Value.String(); got != "/sys/fs/bpf/other" {
		t.Errorf("--pin-path given: %q", got)
	}
}
