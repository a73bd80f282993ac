// Command eztunnel-lab is the benchmark lab: bench quick, memory and lab, the
// traffic generators run inside lab pods (workload, hidden), the tracer with
// CDF plots and its overhead benchmark. It is not part of the agent image.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/lab/traceplot"
)

// version is set by the Makefile (-ldflags -X main.version=...).
var version = "dev"

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "eztunnel-lab:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	trace := cli.TraceCmd(traceplot.PlotCDF)
	trace.AddCommand(traceOverheadCmd())
	return cli.Root("eztunnel-lab", "eztunnel's benchmark lab: baseline vs accelerated on throwaway lab nodes",
		"eztunnel's benchmark lab. It starts the agent binary (eztunnel, next to this one, or --agent) where a\nbenchmark needs a running agent.", version,
		workloadCmd(), benchCmd(), multinodeCmd(), trace)
}
