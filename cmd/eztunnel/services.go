package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

// servicesCmd lists the pinned load balancer's frontends and the backends
// each translates to (what `eztunnel status` only counts).
func servicesCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var output string
	cmd := &cobra.Command{
		Use:   "services",
		Short: "List the Service frontends (ClusterIPs, NodePorts) and their backends (works without a running agent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(output); err != nil {
				return err
			}
			if err := rlimit.RemoveMemlock(); err != nil {
				return fmt.Errorf("remove memlock limit: %w", err)
			}
			fes, err := lb.ReadPinnedFrontends(cfg.Dir())
			if err != nil {
				return err
			}
			if fes == nil {
				if _, serr := os.Stat(cfg.Dir()); serr != nil {
					return fmt.Errorf("no datapath pinned at %s: %w", cfg.Dir(), serr)
				}
				fes = []lb.PinnedFrontend{} // no load balancer (--services off)
			}
			return cli.Render(output, fes, func() { printServices(fes) })
		},
	}
	cli.OutputFlag(cmd, &output)
	layoutFlags(cmd.Flags(), &cfg, nil)
	return cmd
}

func printServices(fes []lb.PinnedFrontend) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FRONTEND\tKIND\tAFFINITY\tBACKENDS")
	for _, f := range fes {
		kind := "ClusterIP"
		if f.NodePort {
			kind = "NodePort (Cluster)"
			if f.Local {
				kind = "NodePort (Local)"
			}
		}
		aff := "-"
		if f.Affinity > 0 {
			aff = fmt.Sprintf("%ds", f.Affinity)
		}
		be := strings.Join(f.Backends, ",")
		if be == "" {
			be = "(none: refused)"
			if f.NodePort {
				be = "(none: kernel path)"
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", f.Frontend, kind, aff, be)
	}
	w.Flush()
}
