package bypass

import (
	"context"

	"github.com/eztunnel/eztunnel/lab/multinode"
)

// What other benchmarks of the multi-node lab (bench trace-paths) share with
// this one: the three datapaths and how their agents are run.

// Datapaths are Bridge, Bypass and Shortcut, in report order.
func Datapaths() []string { return append([]string(nil), datapaths...) }

// Agents is one agent per node, or none (Bridge).
type Agents = agents

// StartAgents starts, for datapath dp, an agent in each node's namespace
// (none for Bridge) and waits until each has discovered its node's pods.
// o.Agent and o.IPv6 are used; tmp holds ready and lock files.
func StartAgents(ctx context.Context, o Options, dp, tmp string, nodes ...*multinode.Node) (*Agents, error) {
	return startAgents(ctx, o, dp, tmp, nodes...)
}

// Stop stops the agents and uninstalls what they pinned.
func (a *agents) Stop() error { return a.stop() }

// Bypassed is the packets the agents' bypass counted so far, on all nodes.
func (a *agents) Bypassed() (float64, error) {
	b, _, _, err := a.counters()
	return b, err
}

// SweepPins uninstalls what the agents of a killed run left pinned.
func SweepPins(nodes ...*multinode.Node) error { return sweepPins(nodes...) }
