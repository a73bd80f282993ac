package agent

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
)

// FamilyOptions are a family's own options (bypass.Options,
// svcsync.Options): its flags, registered, parsed and checked by itself.
// `eztunnel run` registers and parses every family's, and the agent checks
// each before anything changes, from Config.FamilyOptions: a new option
// changes only its family.
type FamilyOptions interface {
	Register(f *pflag.FlagSet)
	// Parse completes the options once f is parsed; flags that do not go
	// together are an error naming them.
	Parse(f *pflag.FlagSet) error
	// CheckNode checks the node (and the options' sources) before
	// anything changes; nothing is loaded. A family that cannot run and
	// was not required turns itself off with the reason.
	CheckNode() error
}

// FamilyOptions lists the options of every family that has its own, in
// install order.
func (c *Config) FamilyOptions() []FamilyOptions {
	return []FamilyOptions{&c.Datapath.Families.Bypass, &c.Services}
}

// familyNode is a datapath family's side of the node, which the agent runs
// beside the family's pinned programs once they are installed: the bridge
// bypass's bypass.Node, the Service load balancer's svcsync.Node. Each is
// made in agent.families and started in agent.converge (what starts one is
// the family's own: the bypass follows the pods' devices, the load balancer
// its source); from then on the agent serves their metrics, asks their
// readiness and stops them all the same way, through a.nodes.
type familyNode interface {
	Collectors() []prometheus.Collector
	// Close stops converging (the family stays pinned and attached); safe
	// to call twice.
	Close()
}

// readinessChecker is a familyNode with a readiness check: why the agent
// is not ready ("" when it is).
type readinessChecker interface{ NotReady() string }

// notReady joins the readiness of every family node.
func notReady(nodes []familyNode) func() string {
	return func() string {
		var why []string
		for _, n := range nodes {
			if r, ok := n.(readinessChecker); ok {
				if w := r.NotReady(); w != "" {
					why = append(why, w)
				}
			}
		}
		return strings.Join(why, "; ")
	}
}
