// Command eztunnel-lab is the benchmark lab: bench quick, memory and lab, the
// traffic generators run inside lab pods (workload, hidden), the tracer with
// CDF plots and its overhead benchmark. It is not part of the agent image.
package main

import (
	"fmt"
	"os"

	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/lab/traceplot"
)

// version is set by the Makefile (-ldflags -X main.version=...).
var version = "dev"

func main() {
	trace := cli.TraceCmd(traceplot.PlotCDF)
	trace.AddCommand(traceOverheadCmd())
	root := cli.Root("eztunnel-lab", "eztunnel's benchmark lab: baseline vs accelerated on throwaway lab nodes",
		"eztunnel's benchmark lab. It starts the agent binary (eztunnel, next to this one, or --agent) where a\nbenchmark needs a running agent.", version,
		workloadCmd(), benchCmd(), multinodeCmd(), trace)
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "eztunnel-lab:", err)
		os.Exit(1)
	}
}
