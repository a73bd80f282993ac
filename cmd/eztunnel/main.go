// Command eztunnel is the node agent and its CLI: run, status, connections,
// uninstall and trace. The benchmark lab is a separate binary
// (lab/cmd/eztunnel-lab), so the agent image carries none of it.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// version and commit are set by the Makefile (-ldflags -X main.version=...
// -X main.commit=...); a plain `go build` leaves "dev", and `eztunnel
// version` then reports the VCS revision Go stamped, if any.
var (
	version = "dev"
	commit  = ""
)

func main() {
	agentlock.Version = buildVersion().Version
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "eztunnel:", err)
		os.Exit(exitCode(err))
	}
}

// Exit codes (docs/operating.md, "Troubleshooting by symptom").
const (
	exitError        = 1 // any other failure
	exitUsage        = 2 // a command line the command cannot run (flags, arguments)
	exitNotInstalled = 3 // no datapath is pinned where the command looked (--pin-path)
	exitNotPermitted = 4 // the kernel refused an operation: not root, a capability missing
	exitPartial      = 5 // done in part: uninstall left the datapath pinned; run it again
)

// exitCode is the exit code of err.
func exitCode(err error) int {
	var usage cli.UsageError
	switch {
	case errors.As(err, &usage):
		return exitUsage
	case errors.Is(err, datapath.ErrNotInstalled):
		return exitNotInstalled
	case errors.Is(err, datapath.ErrPartial):
		return exitPartial
	case errors.Is(err, os.ErrPermission):
		return exitNotPermitted
	}
	return exitError
}

func newRoot() *cobra.Command {
	return cli.Root("eztunnel", "eBPF data-plane accelerator for node-local TCP",
		"eBPF data-plane accelerator for node-local TCP.", buildVersion().Version,
		runCmd(), preflightCmd(), statusCmd(), connectionsCmd(), adoptCmd(), uninstallCmd(), servicesCmd(), readyCmd(), versionCmd(), bugreportCmd(), logLevelCmd(), probeCmd(), cli.TraceCmd(nil))
}
