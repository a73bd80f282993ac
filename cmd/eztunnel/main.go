// Command eztunnel is the node agent and its CLI: run, status, connections,
// uninstall and trace. The benchmark lab is a separate binary
// (lab/cmd/eztunnel-lab), so the agent image carries none of it.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/cli"
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
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	return cli.Root("eztunnel", "eBPF data-plane accelerator for node-local TCP",
		"eBPF data-plane accelerator for node-local TCP.", buildVersion().Version,
		runCmd(), preflightCmd(), statusCmd(), connectionsCmd(), adoptCmd(), uninstallCmd(), servicesCmd(), readyCmd(), versionCmd(), bugreportCmd(), cli.TraceCmd(nil))
}
