package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/kernelinfo"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/tracer"
)

// preflightReport is the JSON form of `eztunnel preflight -o json`.
type preflightReport struct {
	Kernel       string         `json:"kernel"`
	Capabilities []string       `json:"capabilities"`
	Requirements []string       `json:"requirements_unmet,omitempty"`
	Parts        []parts.Status `json:"parts"`
	// CoreRuns: the socket shortcut can run (the exit code is 0 only then).
	CoreRuns bool `json:"core_runs"`
}

func preflightCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "preflight",
		Short: "Tell, for this node, which parts of eztunnel can run and why the others cannot (loads each part's programs on trial; attaches and pins nothing)",
		Long: "preflight loads every part's programs on trial in this process, against fresh unpinned maps, and reports which parts can run on this kernel with this process's capabilities, and for each other the exact reason (the program the kernel refused, a helper, kfunc, tracepoint or module it lacks). Nothing is attached or pinned. " +
			"It exits non-zero only when the core (the socket shortcut with its unread bound and its release) cannot run.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(output); err != nil {
				return err
			}
			rep := preflight()
			if err := cli.Render(output, rep, func() { printPreflight(rep) }); err != nil {
				return err
			}
			if !rep.CoreRuns {
				return fmt.Errorf("the socket shortcut cannot run on this node: %s", reasonOff(rep))
			}
			return nil
		},
	}
	cli.OutputFlag(cmd, &output)
	return cmd
}

func preflight() *preflightReport {
	rep := &preflightReport{Kernel: kernelinfo.Release(), Capabilities: kernelinfo.Capabilities()}
	if rep.Capabilities == nil {
		rep.Capabilities = []string{}
	}
	var all parts.Report
	rep.Requirements = bpfsys.Unmet(datapath.Requirements())
	if err := rlimit.RemoveMemlock(); err != nil {
		rep.Requirements = append(rep.Requirements, "remove memlock limit: "+err.Error())
	}
	all.Merge(datapath.Probe()) // every family the manager installs
	all.Set(tracer.Probe())
	rep.Parts = all.Sorted()
	rep.CoreRuns = len(rep.Requirements) == 0 && all.Runs(parts.Shortcut)
	return rep
}

func reasonOff(rep *preflightReport) string {
	if len(rep.Requirements) > 0 {
		return strings.Join(rep.Requirements, "; ")
	}
	for _, s := range rep.Parts {
		if s.Part == parts.Shortcut {
			return s.Reason
		}
	}
	return "unknown"
}

func printPreflight(rep *preflightReport) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "kernel\t%s\n", rep.Kernel)
	fmt.Fprintf(w, "capabilities\t%s\n", strings.Join(rep.Capabilities, " "))
	for _, r := range rep.Requirements {
		fmt.Fprintf(w, "unmet\t%s\n", r)
	}
	for _, s := range rep.Parts {
		if s.Runs {
			fmt.Fprintf(w, "%s\tcan run\t%s\n", s.Part, s.Via)
		} else {
			fmt.Fprintf(w, "%s\tcannot run\t%s\n", s.Part, oneLine(s.Reason))
		}
	}
	w.Flush()
}

// oneLine keeps a verifier error's lines on one table row.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
