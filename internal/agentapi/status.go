package agentapi

import (
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// NodeStatus is `eztunnel status -o json`: the pinned datapath as a command
// beside it reads it, and the running agent's own view (Status). `kubectl
// eztunnel status` sums it over the nodes.
type NodeStatus struct {
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
	Agent *Holder `json:"agent"`
	Lock  string  `json:"lock"`
	// AgentView is what the running agent answers on its local API (its
	// pods, its API watch); nil: none answered (AgentViewErr says why when
	// one runs).
	AgentView    *Status `json:"agent_view"`
	AgentViewErr string  `json:"agent_view_error,omitempty"`
}

// Holder is the agent holding a datapath's lock (agentlock's record).
type Holder struct {
	Holder  string `json:"holder"`
	PID     int    `json:"pid"`
	Version string `json:"version"` // "" for an agent older than this field
}
