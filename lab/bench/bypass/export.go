package bypass

import (
	"context"

	"github.com/eztunnel/eztunnel/lab/multinode"
)

// What other benchmarks of the multi-node lab (bench trace-paths, bench
// mesh-matrix) share with this one: the three datapaths and how their
// agents are run.

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

// RunAgents starts an agent in each node's namespace as spec says (its
// metrics at MetricsAddr there) and waits until each is ready.
func RunAgents(ctx context.Context, spec AgentSpec, tmp string, nodes ...*multinode.Node) (*Agents, error) {
	return runAgents(ctx, spec, tmp, nodes...)
}

// NoAgents is the datapath without agents: Stop does nothing, Nodes is empty.
func NoAgents() *Agents { return &agents{} }

// MetricsAddr is where each agent serves its metrics, in its node's namespace.
const MetricsAddr = metrics0

// Nodes are the nodes an agent runs on.
func (a *agents) Nodes() []*multinode.Node { return a.nodes }

// Stop stops the agents and uninstalls what they pinned.
func (a *agents) Stop() error { return a.stop() }

// Bypassed is the packets the agents' bypass counted so far, on all nodes.
func (a *agents) Bypassed() (float64, error) {
	b, _, _, err := a.counters()
	return b, err
}

// SweepPins uninstalls what the agents of a killed run left pinned.
func SweepPins(nodes ...*multinode.Node) error { return sweepPins(nodes...) }
