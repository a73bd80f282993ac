package main

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// versionReport is `eztunnel version -o json`.
type versionReport struct {
	Version  string `json:"version"`
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
	Platform string `json:"platform"`
	// Schema is the layout of the pinned maps this binary reads and writes.
	Schema string `json:"schema"`
	// Agent is the agent holding the node's lock; nil: none runs.
	Agent *agentapi.Holder `json:"agent"`
	Lock  string           `json:"lock"`
	// PinnedSchemas are the schemas of the datapaths pinned under
	// --pin-path (none: nothing is pinned).
	PinnedSchemas []string `json:"pinned_schemas"`
}

// buildVersion is version as the Makefile set it; for a plain `go build`
// ("dev") the VCS revision Go stamped, with -dirty for a modified tree.
func buildVersion() versionReport {
	r := versionReport{Version: version, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH, Schema: datapath.Schema}
	r.Commit = commit
	if bi, ok := debug.ReadBuildInfo(); ok && r.Commit == "" {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				r.Commit = s.Value
			case "vcs.modified":
				r.Modified = s.Value == "true"
			}
		}
	}
	if r.Version == "dev" && r.Commit != "" {
		r.Version = "dev-" + r.Commit[:min(12, len(r.Commit))]
		if r.Modified {
			r.Version += "-dirty"
		}
	}
	return r
}

// readVersion is this binary's versionReport with the running agent's (the
// holder of lockFile, by default the layout's lock) and what is pinned
// under the pin root.
func readVersion(cfg datapath.Config, lockFile string) (versionReport, error) {
	r := buildVersion()
	var err error
	if r.Lock, r.Agent, err = agentAt(cfg, lockFile); err != nil {
		return r, err
	}
	r.PinnedSchemas = bpfsys.PinnedSchemas(cfg.PinRoot)
	return r, nil
}

// agentAt is the lock file (lockFile, or the layout's) and the agent
// holding it; nil: none runs.
func agentAt(cfg datapath.Config, lockFile string) (string, *agentapi.Holder, error) {
	if lockFile == "" {
		lockFile = cfg.Layout().Lock()
	}
	rec, err := agentlock.HolderRecord(lockFile)
	switch {
	case err == nil:
		return lockFile, &agentapi.Holder{Holder: rec.Holder, PID: rec.PID, Version: rec.Version}, nil
	case errors.Is(err, agentlock.ErrNoAgent):
		return lockFile, nil, nil
	}
	return lockFile, nil, fmt.Errorf("lock %s: %w", lockFile, err)
}

func versionCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var output, lockFile string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print this binary's version, commit, Go version and datapath schema, and the running agent's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(output); err != nil {
				return err
			}
			r, err := readVersion(cfg, lockFile)
			if err != nil {
				return err
			}
			return cli.Render(output, r, func() {
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintf(w, "version\t%s\n", r.Version)
				if r.Commit != "" {
					fmt.Fprintf(w, "commit\t%s (modified %v)\n", r.Commit, r.Modified)
				}
				fmt.Fprintf(w, "go\t%s %s\n", r.Go, r.Platform)
				fmt.Fprintf(w, "datapath schema\t%s\n", r.Schema)
				if len(r.PinnedSchemas) > 0 {
					fmt.Fprintf(w, "pinned\t%s in %s\n", strings.Join(r.PinnedSchemas, ", "), cfg.PinRoot)
				} else {
					fmt.Fprintf(w, "pinned\tnothing in %s\n", cfg.PinRoot)
				}
				if r.Agent != nil {
					v := r.Agent.Version
					if v == "" {
						v = "unknown (an agent that does not write its version)"
					}
					fmt.Fprintf(w, "running agent\t%s: %s, pid %d (lock %s)\n", v, r.Agent.Holder, r.Agent.PID, r.Lock)
				} else {
					fmt.Fprintf(w, "running agent\tnone (lock %s free)\n", r.Lock)
				}
				w.Flush()
			})
		},
	}
	cli.OutputFlag(cmd, &output)
	layoutFlags(cmd.Flags(), &cfg, &lockFile)
	return cmd
}
