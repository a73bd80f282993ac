package cli

import (
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// logOutput is where logs go (a test swaps it).
var logOutput io.Writer = os.Stderr

// logs are the global log flags as parsed, for TeeLogs.
var logs logFlags

// TeeLogs sends every later log record to w too, in the same format (the
// agent's bounded log file for `eztunnel bugreport`).
func TeeLogs(w io.Writer) error { return setLogger(io.MultiWriter(logOutput, w)) }

// setLogger makes the flags' handler writing to w the default logger, and
// routes client-go's klog into it, so `kubectl logs` shows one format.
func setLogger(w io.Writer) error {
	h, err := logs.handler(w)
	if err != nil {
		return err
	}
	logger := slog.New(h)
	slog.SetDefault(logger)
	klog.SetSlogLogger(logger.With("logger", "client-go"))
	return nil
}

// Root builds a command tree whose every flag can also be set as
// EZTUNNEL_<FLAG>, with the global --log-format and --log-level flags.
func Root(use, short, long, version string, cmds ...*cobra.Command) *cobra.Command {
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
			return setLogger(logOutput)
		},
	}
	logs.register(root.PersistentFlags())
	root.AddCommand(cmds...)
	markUsage(root)
	return root
}

// UsageError is a command line the command cannot run: an unknown flag, a
// value that does not parse, arguments it does not take.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// markUsage makes the flag and argument errors of cmd and its subcommands
// UsageErrors.
func markUsage(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{err} })
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				return UsageError{err}
			}
			return nil
		}
	}
	for _, c := range cmd.Commands() {
		markUsage(c)
	}
}
