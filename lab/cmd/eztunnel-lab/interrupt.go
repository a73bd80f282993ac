package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// withSelf runs fn with cmd's context, cancelled by SIGINT or SIGTERM so that
// benchmarks clean up on Ctrl-C, and the path of this binary, which they
// start inside lab pods.
func withSelf(cmd *cobra.Command, fn func(ctx context.Context, exe string) error) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	return fn(ctx, exe)
}
