package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

func connectionsCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var output string
	cmd := &cobra.Command{
		Use:   "connections",
		Short: "List accelerated connections, one line per end (works without a running agent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(output); err != nil {
				return err
			}
			if err := rlimit.RemoveMemlock(); err != nil {
				return fmt.Errorf("remove memlock limit: %w", err)
			}
			conns, err := datapath.Connections(cfg)
			if err != nil {
				return err
			}
			if conns == nil {
				conns = []datapath.Connection{}
			}
			return cli.Render(output, conns, func() { printConnections(conns) })
		},
	}
	cli.OutputFlag(cmd, &output)
	layoutFlags(cmd.Flags(), &cfg, nil)
	return cmd
}

func printConnections(conns []datapath.Connection) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COOKIE\tPEER\tROLE\tCLIENT\tSERVER\tNETNS\tNETNS_INODE\tTX_MSGS\tTX_BYTES\tRX_UNREAD\tRX_BOUND\tPATH")
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
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n",
			c.Cookie, c.PeerCookie, c.Role, c.Client, c.Server, c.NetnsCookie, c.NetnsInode, c.TxMsgs, c.TxBytes, c.RxUnread, c.RxBound, path)
	}
	w.Flush()
}
