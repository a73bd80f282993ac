package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/parts"
)

func statusCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var output, lockFile string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print the datapath's counters, map fill levels and pinned links (works without a running agent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(output); err != nil {
				return err
			}
			rep, err := readStatus(cfg, lockFile)
			if err != nil {
				return err
			}
			return cli.Render(output, rep, func() { printStatus(cmd.OutOrStdout(), rep) })
		},
	}
	cli.OutputFlag(cmd, &output)
	layoutFlags(cmd.Flags(), &cfg, &lockFile)
	return cmd
}

func readStatus(cfg datapath.Config, lockFile string) (*agentapi.NodeStatus, error) {
	p, err := datapath.OpenPinned(cfg)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	c, err := p.ReadCounters()
	if err != nil {
		return nil, err
	}
	fill, err := p.ReadFill()
	if err != nil {
		return nil, err
	}
	links, err := datapath.Links(cfg)
	if err != nil {
		return nil, err
	}
	rep := &agentapi.NodeStatus{Schema: datapath.Schema, Pins: cfg.Dir(), Counters: c, Maps: fill, Links: links}
	if rep.Bypass, err = bypass.ReadPinned(cfg.Dir()); err != nil {
		return nil, err
	}
	if rep.Services, err = lb.ReadPinned(cfg.Dir()); err != nil {
		return nil, err
	}
	if pr, err := parts.Read(cfg.Layout().Report()); err == nil {
		rep.Parts = &pr
	} else if !errors.Is(err, parts.ErrNoReport) {
		return nil, fmt.Errorf("read the agent's parts report: %w", err)
	}
	if rep.Lock, rep.Agent, err = agentAt(cfg, lockFile); err != nil {
		return nil, err
	}
	var view agentapi.Status
	switch err := agentapi.Get(context.Background(), cfg.Layout().Socket(), agentapi.StatusPath, &view); {
	case err == nil:
		rep.AgentView = &view
	case rep.Agent != nil || !errors.Is(err, agentapi.ErrNoAgent):
		rep.AgentViewErr = err.Error()
	}
	if rep.Bypass == nil {
		rep.BypassOff = "not running (off with --bypass=off)"
		var bc bypass.Config
		if err := bypass.Check(&bc); err != nil {
			rep.BypassOff = "not running: " + err.Error()
		}
	}
	return rep, nil
}

func printStatus(out io.Writer, rep *agentapi.NodeStatus) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "datapath\t%s (schema %s)\n", rep.Pins, rep.Schema)
	if a := rep.Agent; a != nil {
		fmt.Fprintf(w, "agent\trunning: %s, pid %d, version %s (lock %s)\n", a.Holder, a.PID, cmp.Or(a.Version, "unknown"), rep.Lock)
	} else {
		fmt.Fprintf(w, "agent\tnone: the pinned datapath works on its own (lock %s free)\n", rep.Lock)
	}
	printAgentView(w, rep)
	if rep.Parts != nil {
		fmt.Fprintf(w, "kernel\t%s\n", rep.Parts.Kernel)
		for _, s := range rep.Parts.Sorted() {
			if s.Runs && s.Standby != "" {
				fmt.Fprintf(w, "part %s\tstandby\t%s\n", s.Part, s.Standby)
			} else if s.Runs {
				fmt.Fprintf(w, "part %s\ton\t%s\n", s.Part, s.Via)
				for _, dev := range slices.Sorted(maps.Keys(s.Idle)) {
					fmt.Fprintf(w, "part %s\tidle %s\t%s\n", s.Part, dev, s.Idle[dev])
				}
			} else {
				// The code is the metrics' reason label, the words why.
				off := "off"
				if s.Code != "" {
					off += " (" + string(s.Code) + ")"
				}
				fmt.Fprintf(w, "part %s\t%s\t%s\n", s.Part, off, s.Reason)
			}
		}
	} else {
		fmt.Fprintf(w, "parts\t%s\n", parts.ErrNoReport)
	}
	for _, name := range datapath.CounterNames() {
		fmt.Fprintf(w, "%s\t%d\n", name, rep.Counters[name])
	}
	for _, name := range datapath.FillNames {
		m := rep.Maps[name]
		fmt.Fprintf(w, "map %s\t%d / %d\n", name, m.Entries, m.MaxEntries)
	}
	if b := rep.Bypass; b != nil {
		fmt.Fprintf(w, "bypass\t%d pod veths, %d uplinks, %d endpoints\n", b.PodVeths, b.Uplinks, b.Endpoints)
		for _, name := range bypass.CounterNames() {
			if v := b.Counters[name]; v > 0 || !strings.HasPrefix(name, "fallback_") {
				fmt.Fprintf(w, "bypass %s\t%d\n", name, v)
			}
		}
	} else {
		fmt.Fprintf(w, "bypass\t%s\n", rep.BypassOff)
	}
	if sv := rep.Services; sv != nil {
		fmt.Fprintf(w, "services\t%d frontends, %d NodePorts, %d backends, %d cgroups, %d pods left to their proxy\n", sv.Frontends, sv.NodePorts, sv.Backends, sv.Cgroups, sv.Proxied)
		for _, name := range lb.CounterNames() {
			if v := sv.Counters[name]; v > 0 {
				fmt.Fprintf(w, "services %s\t%d\n", name, v)
			}
		}
	} else {
		fmt.Fprintf(w, "services\tnot running (--services)\n")
	}
	for _, l := range rep.Links {
		fmt.Fprintf(w, "link %s\tid %d, program %d\n", l.Pin, l.ID, l.Program)
	}
	w.Flush()
}

// printAgentView prints what the agent alone knows: its pods and API watch.
func printAgentView(w io.Writer, rep *agentapi.NodeStatus) {
	v := rep.AgentView
	switch {
	case v == nil && rep.AgentViewErr != "":
		fmt.Fprintf(w, "agent api\t%s\n", rep.AgentViewErr)
		return
	case v == nil:
		return
	}
	fmt.Fprintf(w, "agent api\tpid %d, version %s, up %s\n", v.PID, cmp.Or(v.Version, "unknown"), time.Since(v.Started).Round(time.Second))
	k := v.Kubernetes
	if k == nil {
		fmt.Fprintf(w, "kubernetes\toff (plain mode: the managed cgroups are selected)\n")
		return
	}
	health := "healthy"
	switch {
	case !k.Watch.Synced:
		health = "not listed yet"
	case !k.Watch.Healthy():
		health = "failing since " + k.Watch.LastErrorAt.Format(time.RFC3339)
	}
	fmt.Fprintf(w, "kubernetes\tnode %s, pod watch %s (%d errors", k.Node, health, k.Watch.Errors)
	if k.Watch.LastError != "" {
		fmt.Fprintf(w, ", last: %s", k.Watch.LastError)
	}
	fmt.Fprintf(w, ")\n")
	fmt.Fprintf(w, "pods selected\t%d\n", len(k.Selected))
	for _, p := range k.Selected {
		fmt.Fprintf(w, "pod\t%s/%s\n", p.Namespace, p.Name)
	}
}
