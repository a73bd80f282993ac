package cli

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// Root builds a command tree whose every flag can also be set as
// EZTUNNEL_<FLAG>, with the global --log-format and --log-level flags.
func Root(use, short, long, version string, cmds ...*cobra.Command) *cobra.Command {
	var logs logFlags
	root := &cobra.Command{
		Use:           use,
		Short:         short,
		Long:          long + "\n\nEvery flag can also be set as EZTUNNEL_<FLAG> (--max-sockets is EZTUNNEL_MAX_SOCKETS); a flag given on the command line wins.",
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
	root.AddCommand(cmds...)
	return root
}
