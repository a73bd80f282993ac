package meshmatrix

// One eztunnel agent per node, as in `bench bypass` (lab/bench/bypass),
// with the flags of each configuration.

import (
	"context"
	"strings"

	"github.com/eztunnel/eztunnel/lab/bench/bypass"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// agentArgs are the flags that make an agent run configuration cfg (after
// the common ones); nil for the baseline (no agent).
func agentArgs(cfg string) []string {
	switch cfg {
	case ShortcutOnly:
		return []string{"--bypass=false"}
	case BypassOnly:
		// Every connection excluded from the shortcut: tc only.
		return []string{"--bypass", "--exclude-cidrs", "0.0.0.0/0,::/0"}
	case Both:
		return []string{"--bypass"}
	case Idle, IdlePsock:
		return bypass.IdleArgs
	}
	if strings.HasPrefix(cfg, idleRefusePrefix) {
		return bypass.IdleArgs
	}
	return nil
}

// pinPrefix: the agent of node n pins its datapath at pinPrefix + n.NetNS.
const pinPrefix = "/sys/fs/bpf/eztunnel-meshmatrix-"

// agents is one eztunnel agent per node (bench bypass's), or none (the
// baseline).
type agents struct{ *bypass.Agents }

// startAgents starts an agent in each node's namespace for cfg and waits
// until each is ready and, with the bypass, has every pod of its node as an
// endpoint.
func startAgents(ctx context.Context, exe, cfg, tmp string, nodes ...*multinode.Node) (*agents, error) {
	if cfg == Baseline {
		return &agents{bypass.NoAgents()}, nil
	}
	spec := bypass.AgentSpec{Exe: exe, PinPrefix: pinPrefix, Args: agentArgs(cfg), Endpoints: cfg == BypassOnly || cfg == Both,
		Refused: refusedPrograms(cfg)}
	a, err := bypass.RunAgents(ctx, spec, tmp, nodes...)
	if err != nil {
		return nil, err
	}
	return &agents{a}, nil
}

// counters are what the agents did, summed over both nodes.
type counters struct {
	redirected float64 // messages the socket shortcut moved (sk_msg)
	pairs      float64 // connections paired on the shortcut
	bypassed   float64 // packets the tc bypass redirected: same node, out to and in from the other node
	excluded   float64 // connections the shortcut's selection rules left on the kernel path
	fallbacks  map[string]float64
}

func (c counters) sub(b counters) counters {
	d := counters{redirected: c.redirected - b.redirected, pairs: c.pairs - b.pairs, bypassed: c.bypassed - b.bypassed,
		excluded: c.excluded - b.excluded, fallbacks: map[string]float64{}}
	for r, v := range c.fallbacks {
		if x := v - b.fallbacks[r]; x > 0 {
			d.fallbacks[r] = x
		}
	}
	return d
}

// counters reads every agent's metrics (zero without agents).
func (a *agents) counters() (counters, error) {
	c := counters{fallbacks: map[string]float64{}}
	for _, n := range a.Nodes() {
		m, err := bypass.Scrape(n, bypass.MetricsAddr)
		if err != nil {
			return c, err
		}
		for k, v := range m {
			if r, ok := strings.CutPrefix(k, "fallback "); ok {
				c.fallbacks[r] += v
			}
		}
		c.excluded += m["shortcut fallback excluded"]
		c.redirected += m["eztunnel_messages_redirected_total"]
		c.pairs += m["eztunnel_pairs_total"]
		c.bypassed += m["eztunnel_bypass_packets_total"] + m["eztunnel_bypass_out_packets_total"] + m["eztunnel_bypass_in_packets_total"]
	}
	return c, nil
}
