package bypass

import (
	"context"
	"fmt"
	"os"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
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

// OpenSwitches opens the bypass's switch of each agent (bypass.Switch):
// pause(true) pauses the bypass on every node (every packet takes the
// kernel path, the programs attached), pause(false) turns it back on;
// closeAll turns it on and closes the switches.
func (a *agents) OpenSwitches() (pause func(paused bool) error, closeAll func(), err error) {
	var sws []*bypass.Switch
	closeAll = func() {
		for _, s := range sws {
			s.Pause(false)
			s.Close()
		}
	}
	for _, pin := range a.pins {
		s, err := bypass.OpenSwitch(datapath.Config{PinRoot: pin}.Dir())
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		sws = append(sws, s)
	}
	pause = func(paused bool) error {
		for _, s := range sws {
			if err := s.Pause(paused); err != nil {
				return err
			}
		}
		return nil
	}
	return pause, closeAll, nil
}

// Stop stops the agents and uninstalls what they pinned.
func (a *agents) Stop() error { return a.stop() }

// Bypassed is the packets the agents' bypass counted so far, on all nodes.
func (a *agents) Bypassed() (float64, error) {
	b, _, _, err := a.counters()
	return b, err
}

// PinPrefix is where these benchmarks' agents pin: node n at PinPrefix +
// n.NetNS (NewLab sweeps it).
const PinPrefix = pinPrefix

// NewLab is the two-node lab of these benchmarks in mode, ready for
// agents pinning at prefix + a node's netns name: what a killed run's
// agents left pinned there is uninstalled, and each node's conntrack
// accepts the windows of flows whose packets it saw only in part (those the
// bypass carried: nf_conntrack_tcp_be_liberal). Pods are the caller's to
// add. On error the lab is closed.
func NewLab(name string, mode multinode.Mode, prefix string) (_ *multinode.Lab, err error) {
	l, err := multinode.New(multinode.Options{Name: name, Nodes: 2, Mode: mode})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := sweepPinsAt(prefix, l.Nodes...); err != nil {
		return nil, err
	}
	for _, n := range l.Nodes {
		if err := n.Do(func() error {
			return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal", []byte("1"), 0o644)
		}); err != nil {
			return nil, fmt.Errorf("%s: nf_conntrack_tcp_be_liberal: %w", n.Name, err)
		}
	}
	return l, nil
}
