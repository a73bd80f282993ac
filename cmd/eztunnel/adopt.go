package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// adoptReport is what `eztunnel adopt` prints: the adoption counters' change
// over the round it asked for.
type adoptReport struct {
	Rounds  uint64            `json:"rounds"`
	Adopted uint64            `json:"adopted"`
	Skipped map[string]uint64 `json:"skipped"`
}

func adoptCmd() *cobra.Command {
	cfg := datapath.DefaultConfig()
	var output, lockFile string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "adopt",
		Short: "Ask the running agent to adopt the connections established before it, now, and print what it did",
		Long: `Asks the running agent (SIGUSR1) for an adoption round: connections whose two
ends are local sockets in managed cgroups, quiet in both directions, are put on
the shortcut; busy ones are retried at later rounds, never forced. Prints the
change of the adoption counters over the round.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(output); err != nil {
				return err
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s must be positive", timeout)
			}
			if lockFile == "" {
				lockFile = cfg.Layout().Lock()
			}
			rep, err := requestAdoption(cfg, lockFile, timeout)
			if err != nil {
				return err
			}
			return cli.Render(output, rep, func() {
				w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintf(w, "adopted\t%d\n", rep.Adopted)
				for _, name := range datapath.AdoptCounterNames() {
					if r, ok := cutSkip(name); ok {
						fmt.Fprintf(w, "skipped %s\t%d\n", r, rep.Skipped[r])
					}
				}
				w.Flush()
			})
		},
	}
	cli.OutputFlag(cmd, &output)
	f := cmd.Flags()
	layoutFlags(f, &cfg, &lockFile)
	f.DurationVar(&timeout, "timeout", 60*time.Second, "how long to wait for the agent's round")
	return cmd
}

func cutSkip(name string) (string, bool) { return strings.CutPrefix(name, "adopt_skipped_") }

func requestAdoption(cfg datapath.Config, lockFile string, timeout time.Duration) (*adoptReport, error) {
	p, err := datapath.OpenPinned(cfg)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	if p.AdoptCounters == nil {
		return nil, fmt.Errorf("the datapath pinned at %s was installed by a build without adoption: restart the agent with this build", cfg.Dir())
	}
	before, err := p.ReadCounters()
	if err != nil {
		return nil, err
	}
	pid, err := agentlock.HolderPID(lockFile)
	if errors.Is(err, agentlock.ErrNoAgent) {
		return nil, fmt.Errorf("no agent is running (%w): adoption runs in the agent, with its selection; start `eztunnel run`", err)
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		return nil, fmt.Errorf("signal the agent (pid %d): %w", pid, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		time.Sleep(50 * time.Millisecond)
		after, err := p.ReadCounters()
		if err != nil {
			return nil, err
		}
		if after["adopt_rounds"] > before["adopt_rounds"] {
			rep := &adoptReport{Rounds: after["adopt_rounds"] - before["adopt_rounds"],
				Adopted: after["adopted"] - before["adopted"], Skipped: map[string]uint64{}}
			for _, name := range datapath.AdoptCounterNames() {
				if r, ok := cutSkip(name); ok {
					rep.Skipped[r] = after[name] - before[name]
				}
			}
			return rep, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the agent (pid %d) ran no adoption round within %s: is it ready, and started without --adopt=false?", pid, timeout)
		}
	}
}
