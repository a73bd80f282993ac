package main

import (
	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/nodelayout"
)

// layoutFlags adds --pin-path and --run-dir, which place the datapath's
// paths on the node (internal/nodelayout), to a command that reads or
// writes them; lockFile, if not nil, gets --lock-file (default: the
// layout's lock). Like every flag they can come from the environment
// (EZTUNNEL_PIN_PATH, EZTUNNEL_RUN_DIR, EZTUNNEL_LOCK_FILE: internal/cli),
// which the chart sets in the agent's pod, so a command exec'd there reads
// the places the agent uses whatever the chart's pinPath and lockDir.
func layoutFlags(f *pflag.FlagSet, cfg *datapath.Config, lockFile *string) {
	f.StringVar(&cfg.PinRoot, "pin-path", cfg.PinRoot, "bpffs directory of the pinned datapath")
	f.StringVar(&cfg.RunDir, "run-dir", nodelayout.DefaultRunDir, "directory of the agents' files: lock, parts report, recent log (tmpfs; the chart's lockDir)")
	if lockFile != nil {
		f.StringVar(lockFile, "lock-file", "", "the agents' lock file (default: agent.lock in --run-dir for the default --pin-path, a file named after the pin path otherwise)")
	}
}
