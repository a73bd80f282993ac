package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
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
			p := newConnPrinter(cmd.OutOrStdout(), output == "json")
			l, err := listConnections(cmd.Context(), cfg, fromPins, p.add)
			if err != nil {
				// What was printed stays unterminated: no reader takes it
				// for the whole listing.
				p.w.Flush()
				return err
			}
			if err := p.close(); err != nil {
				return err
			}
			if l.Unlisted > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "eztunnel: %d network namespaces could not be entered (%s); their connections come from the connection index, without tx counters (%d ends)\n", l.Unlisted, l.UnlistedWhy, l.Indexed)
			}
			return nil
		},
	}
	cli.OutputFlag(cmd, &output)
	cmd.Flags().BoolVar(&fromPins, "from-pins", false, "list from the pinned datapath in this process, without asking the running agent (then no pod names)")
	layoutFlags(cmd.Flags(), &cfg, nil)
	return cmd
}

// listConnections asks the running agent (its local API), or lists from the
// pins when none answers or fromPins, handing each end to emit as it comes
// (the returned Listing has no Conns). The agent's answer streams: it fails
// when the agent sends nothing for agentapi.IdleTimeout, not after a total.
func listConnections(ctx context.Context, cfg datapath.Config, fromPins bool, emit func(datapath.Connection) error) (datapath.Listing, error) {
	if !fromPins {
		l, err := agentapi.Connections(ctx, cfg.Layout().Socket(), emit)
		if !errors.Is(err, agentapi.ErrNoAgent) {
			return l, err
		}
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return datapath.Listing{}, fmt.Errorf("remove memlock limit: %w", err)
	}
	return datapath.StreamConnections(ctx, cfg, emit)
}

// tableBlock is how many rows the table aligns at a time: a listing of
// at most tableBlock ends is one aligned table.
const tableBlock = 4096

// connPrinter prints ends as they come: -o json as the one indented array
// cli.Render writes, byte for byte; the table aligned per tableBlock rows.
type connPrinter struct {
	w    *bufio.Writer
	tw   *tabwriter.Writer
	json bool
	n    int
}

func newConnPrinter(out io.Writer, asJSON bool) *connPrinter {
	w := bufio.NewWriterSize(out, 64<<10)
	return &connPrinter{w: w, tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0), json: asJSON}
}

// add prints one end.
func (p *connPrinter) add(c datapath.Connection) error {
	defer func() { p.n++ }()
	if p.json {
		b, err := json.MarshalIndent(c, "  ", "  ")
		if err != nil {
			return err
		}
		sep := ",\n  "
		if p.n == 0 {
			sep = "[\n  "
		}
		p.w.WriteString(sep)
		_, err = p.w.Write(b)
		return err
	}
	if p.n == 0 {
		printHeader(p.tw)
	}
	printRow(p.tw, c)
	if (p.n+1)%tableBlock == 0 {
		return p.tw.Flush()
	}
	return nil
}

// close ends the output.
func (p *connPrinter) close() error {
	switch {
	case p.json && p.n == 0:
		p.w.WriteString("[]\n")
	case p.json:
		p.w.WriteString("\n]\n")
	default:
		if p.n == 0 {
			printHeader(p.tw)
		}
		p.tw.Flush()
	}
	return p.w.Flush()
}

func printHeader(w io.Writer) {
	fmt.Fprintln(w, "COOKIE\tPEER\tROLE\tPOD\tCLIENT\tSERVER\tNETNS\tNETNS_INODE\tTX_MSGS\tTX_BYTES\tRX_UNREAD\tRX_BOUND\tPATH")
}

func printRow(w io.Writer, c datapath.Connection) {
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
