package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/multinode"
)

func multinodeCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "multinode", Short: "A multi-node lab (nodes, pods, underlay, node firewalls) in network namespaces"}
	cmd.AddCommand(multinodeUpCmd(), multinodeSweepCmd())
	return cmd
}

func multinodeUpCmd() *cobra.Command {
	var o multinode.Options
	var mode string
	var pods int
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Build a lab, print its layout, keep it until Ctrl-C (or SIGTERM), then remove it (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Mode = multinode.Mode(mode)
			if pods < 0 || pods > multinode.MaxPodsPerNode {
				return fmt.Errorf("--pods %d out of range 0..%d", pods, multinode.MaxPodsPerNode)
			}
			return withSelf(cmd, func(ctx context.Context, _ string) (err error) {
				l, err := multinode.New(o)
				if err != nil {
					return err
				}
				defer func() {
					if cerr := l.Close(); cerr != nil && err == nil {
						err = cerr
					}
				}()
				for _, n := range l.Nodes {
					for j := 1; j <= pods; j++ {
						if _, err := n.AddPod(fmt.Sprintf("%sp%d", n.Name, j), true); err != nil {
							return err
						}
					}
				}
				l.Describe(os.Stdout)
				fmt.Println("ready; Ctrl-C removes the lab")
				<-ctx.Done()
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Name, "name", "mn", "lab name (1..6 of [a-z0-9]); every namespace is ezl-<name>-...")
	f.IntVar(&o.Nodes, "nodes", 2, "nodes")
	f.StringVar(&mode, "mode", string(multinode.HostGW), "routing between nodes: host-gw or vxlan")
	f.IntVar(&pods, "pods", 2, "pods per node (n<i>p<j>)")
	f.IntVar(&o.UnderlayMTU, "underlay-mtu", 0, "MTU of the underlay and uplinks (default 1500)")
	f.IntVar(&o.PodMTU, "pod-mtu", 0, "MTU of pods and node bridges (default: what a CNI would set); above the path's for a PMTU path")
	f.StringVar(&o.ForwardPolicy, "forward-policy", "DROP", "policy of each node's FORWARD chain (DROP or ACCEPT)")
	return cmd
}

func multinodeSweepCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "sweep",
		Short: "Remove what labs of killed processes left behind (needs root)",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return multinode.Sweep() },
	}
}
