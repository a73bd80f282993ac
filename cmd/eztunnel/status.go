package main

import (
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// statusReport is the JSON form of `eztunnel status -o json`.
type statusReport struct {
	Schema   string             `json:"schema"`
	Pins     string             `json:"pins"`
	Counters datapath.Counters  `json:"counters"`
	Maps     map[string]mapFill `json:"maps"`
}

type mapFill struct {
	Entries    int    `json:"entries"`
	MaxEntries uint32 `json:"max_entries"`
}

func statusCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print the datapath's counters and map fill levels (works without a running agent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("-o %q: want table or json", output)
			}
			rep, err := readStatus(cfg)
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			printStatus(rep)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&cfg.PinRoot, "pin-path", cfg.PinRoot, "bpffs directory of the pinned datapath")
	return cmd
}

func readStatus(cfg datapath.Config) (*statusReport, error) {
	p, err := datapath.OpenPinned(cfg)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	c, err := datapath.ReadCounters(p.Counters)
	if err != nil {
		return nil, err
	}
	rep := &statusReport{Schema: datapath.Schema, Pins: cfg.Dir(), Counters: c, Maps: map[string]mapFill{}}
	for _, m := range []struct {
		name string
		n    func() (int, error)
		max  uint32
	}{
		{"sockets", func() (int, error) { return datapath.Entries(p.Sockets) }, p.Sockets.MaxEntries()},
		{"pairs", func() (int, error) { return datapath.Entries(p.Pairs) }, p.Pairs.MaxEntries()},
		{"aliases", func() (int, error) { return datapath.Entries(p.Aliases) }, p.Aliases.MaxEntries()},
	} {
		n, err := m.n()
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", m.name, err)
		}
		rep.Maps[m.name] = mapFill{Entries: n, MaxEntries: m.max}
	}
	return rep, nil
}

func printStatus(rep *statusReport) {
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "datapath\t%s (schema %s)\n", rep.Pins, rep.Schema)
	for _, name := range datapath.CounterNames() {
		fmt.Fprintf(w, "%s\t%d\n", name, rep.Counters[name])
	}
	for _, name := range []string{"sockets", "pairs", "aliases"} {
		m := rep.Maps[name]
		fmt.Fprintf(w, "map %s\t%d / %d\n", name, m.Entries, m.MaxEntries)
	}
	w.Flush()
}
