package main

import (
	"os"

	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/nodelayout"
)

// The environment that gives --pin-path, --run-dir and --lock-file their
// defaults: the chart sets them in the agent's pod, so a command exec'd
// there (status, connections, bugreport, uninstall, version) reads the
// places the agent uses whatever the chart's pinPath and lockDir.
const (
	envPinPath  = "EZTUNNEL_PIN_PATH"
	envRunDir   = "EZTUNNEL_RUN_DIR"
	envLockFile = "EZTUNNEL_LOCK_FILE"
)

// layoutFlags adds --pin-path and --run-dir, which place the datapath's
// paths on the node (internal/nodelayout), to a command that reads or
// writes them; lockFile, if not nil, gets --lock-file (default: the
// layout's lock).
func layoutFlags(f *pflag.FlagSet, cfg *datapath.Config, lockFile *string) {
	f.StringVar(&cfg.PinRoot, "pin-path", envOr(envPinPath, cfg.PinRoot), "bpffs directory of the pinned datapath ($"+envPinPath+")")
	f.StringVar(&cfg.RunDir, "run-dir", envOr(envRunDir, nodelayout.DefaultRunDir), "directory of the agents' files: lock, parts report, recent log (tmpfs; the chart's lockDir; $"+envRunDir+")")
	if lockFile != nil {
		f.StringVar(lockFile, "lock-file", os.Getenv(envLockFile), "the agents' lock file ($"+envLockFile+"; default: agent.lock in --run-dir for the default --pin-path, a file named after the pin path otherwise)")
	}
}

// envOr is the environment variable name, or def where it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
