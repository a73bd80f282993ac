package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// statusReport is the JSON form of `eztunnel status -o json`.
type statusReport struct {
	Schema   string                      `json:"schema"`
	Pins     string                      `json:"pins"`
	Counters datapath.Counters           `json:"counters"`
	Maps     map[string]datapath.MapFill `json:"maps"`
	Links    []datapath.PinnedLink       `json:"links"`
	// Bypass is the pinned bridge bypass; nil: none is pinned (BypassOff
	// says what this node's settings would allow).
	Bypass    *bypass.PinnedState `json:"bypass"`
	BypassOff string              `json:"bypass_off,omitempty"`
	// Services is the pinned Service load balancer; nil: none.
	Services *lb.PinnedState `json:"services"`
	// Parts is what the last agent of this datapath reported running, and
	// why each other part does not; nil: no agent has reported since boot.
	Parts *parts.Report `json:"parts"`
	// Agent is the agent holding the datapath's lock now; nil: none runs
	// (the datapath keeps working pinned). Lock is that lock file.
	Agent *runningAgent `json:"agent"`
	Lock  string        `json:"lock"`
}

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

func readStatus(cfg datapath.Config, lockFile string) (*statusReport, error) {
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
	rep := &statusReport{Schema: datapath.Schema, Pins: cfg.Dir(), Counters: c, Maps: fill, Links: links}
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
	if rep.Bypass == nil {
		rep.BypassOff = "not running (off with --bypass=off)"
		var bc bypass.Config
		if err := bypass.Check(&bc); err != nil {
			rep.BypassOff = "not running: " + err.Error()
		}
	}
	return rep, nil
}

func printStatus(out io.Writer, rep *statusReport) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "datapath\t%s (schema %s)\n", rep.Pins, rep.Schema)
	if a := rep.Agent; a != nil {
		fmt.Fprintf(w, "agent\trunning: %s, pid %d, version %s (lock %s)\n", a.Holder, a.PID, cmp.Or(a.Version, "unknown"), rep.Lock)
	} else {
		fmt.Fprintf(w, "agent\tnone: the pinned datapath works on its own (lock %s free)\n", rep.Lock)
	}
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
