package agent

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

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
