// Command eztunnel accelerates node-local TCP with eBPF. main only parses
// flags; each subcommand's run function does the work.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// version is set by the Makefile (-ldflags -X main.version=...).
var version = "dev"

func main() {
	root := &cobra.Command{
		Use:           "eztunnel",
		Short:         "eBPF data-plane accelerator for node-local TCP",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.AddCommand(runCmd(), statusCmd(), uninstallCmd(), workloadCmd(), benchCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "eztunnel:", err)
		os.Exit(1)
	}
}
