// Command eztunnel accelerates node-local TCP with eBPF. main only parses
// flags; each subcommand's run function does the work.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// version is set by the Makefile (-ldflags -X main.version=...).
var version = "dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "eztunnel:", err)
		os.Exit(1)
	}
}

// newRoot builds the command tree.
func newRoot() *cobra.Command {
	var logs logFlags
	root := &cobra.Command{
		Use:           "eztunnel",
		Short:         "eBPF data-plane accelerator for node-local TCP",
		Long:          "eBPF data-plane accelerator for node-local TCP.\n\nEvery flag can also be set as EZTUNNEL_<FLAG> (--max-sockets is EZTUNNEL_MAX_SOCKETS); a flag given on the command line wins.",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
		// Runs before every subcommand: environment, then logging.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindOSEnv(cmd.Flags()); err != nil {
				return err
			}
			h, err := logs.handler(os.Stderr)
			if err != nil {
				return err
			}
			slog.SetDefault(slog.New(h))
			return nil
		},
	}
	logs.register(root.PersistentFlags())
	root.AddCommand(runCmd(), statusCmd(), connectionsCmd(), uninstallCmd(), workloadCmd(), benchCmd(), traceCmd())
	return root
}
