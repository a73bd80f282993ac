package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

func connectionsCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var output string
	var fromPins bool
	cmd := &cobra.Command{
		Use:   "connections",
		Short: "List accelerated connections, one line per end, named by pod where the agent knows it (works without a running agent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(output); err != nil {
				return err
			}
			l, err := listConnections(cmd.Context(), cfg, fromPins)
			if err != nil {
				return err
			}
			if l.Unlisted > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "eztunnel: %d network namespaces could not be entered (%s); their connections come from the connection index, without tx counters (%d ends)\n", l.Unlisted, l.UnlistedWhy, l.Indexed)
			}
			conns := l.Conns
			if conns == nil {
				conns = []datapath.Connection{}
			}
			return cli.Render(output, conns, func() { printConnections(cmd.OutOrStdout(), conns) })
		},
	}
	cli.OutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&fromPins, "from-pins", false, "list from the pinned datapath in this process, without asking the running agent (then no pod names)")
	layoutFlags(cmd.Flags(), &cfg, nil)
	return cmd
}

// listConnections asks the running agent (its local API), or lists from the
// pins when none answers or fromPins.
func listConnections(ctx context.Context, cfg datapath.Config, fromPins bool) (datapath.Listing, error) {
	if !fromPins {
		var l datapath.Listing
		err := agentapi.Get(ctx, cfg.Layout().Socket(), agentapi.ConnectionsPath, &l)
		if !errors.Is(err, agentapi.ErrNoAgent) {
			return l, err
		}
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return datapath.Listing{}, fmt.Errorf("remove memlock limit: %w", err)
	}
	return datapath.ListConnections(cfg)
}

func printConnections(out io.Writer, conns []datapath.Connection) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COOKIE\tPEER\tROLE\tPOD\tCLIENT\tSERVER\tNETNS\tNETNS_INODE\tTX_MSGS\tTX_BYTES\tRX_UNREAD\tRX_BOUND\tPATH")
	for _, c := range conns {
		path := "shortcut"
		switch {
		case c.Left:
			path = "kernel (switched, left)"
		case c.Switched:
			path = "switched (draining)"
		case c.Adopted:
			path = "shortcut (adopted)"
		}
		// From the connection index (a namespace the listing could not
		// enter): no tx counters.
		txMsgs, txBytes := fmt.Sprint(c.TxMsgs), fmt.Sprint(c.TxBytes)
		if c.Indexed {
			txMsgs, txBytes = "-", "-"
		}
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%d\t%s\n",
			c.Cookie, c.PeerCookie, c.Role, cmp.Or(c.Pod, "-"), c.Client, c.Server, c.NetnsCookie, c.NetnsInode, txMsgs, txBytes, c.RxUnread, c.RxBound, path)
	}
	w.Flush()
}
