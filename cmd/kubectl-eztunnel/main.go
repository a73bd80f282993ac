// Command kubectl-eztunnel is eztunnel's kubectl plugin: `kubectl eztunnel
// status` runs `eztunnel status` in every agent pod of the cluster and sums
// what they report; `kubectl eztunnel connectivity` runs test pods and
// checks which pairs take the shortcut. It is installed next to kubectl
// (any directory on PATH), never in the agent's image.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/cli"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-eztunnel:", err)
		var usage cli.UsageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	return cli.Root("kubectl-eztunnel", "eztunnel's kubectl plugin: the cluster's agents at once",
		"eztunnel's kubectl plugin (kubectl eztunnel): the cluster's agents at once.", "", statusCmd(), connectivityCmd())
}
