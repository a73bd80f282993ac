package agent

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// serveAPI answers `eztunnel status` and `eztunnel connections` on the run
// directory's socket (internal/agentapi) until the agent's parts stop.
func (a *agent) serveAPI() error {
	ln, err := agentapi.Listen(a.cfg.Datapath.Layout().Socket())
	if err != nil {
		return err
	}
	started := time.Now()
	a.parts.addFunc(agentapi.Serve(ln, agentapi.Handlers{
		Status:      func() agentapi.Status { return a.apiStatus(started) },
		Connections: a.connections,
	}))
	return nil
}

func (a *agent) apiStatus(started time.Time) agentapi.Status {
	st := agentapi.Status{PID: os.Getpid(), Version: a.cfg.Version, Started: started}
	if a.pods == nil {
		return st
	}
	ks := &agentapi.KubeStatus{Node: a.cfg.Kubernetes.NodeName, Watch: a.pods.watch.Health(), Selected: []agentapi.Pod{}}
	for _, p := range a.pods.Pods() {
		ks.Selected = append(ks.Selected, agentapi.Pod{Namespace: p.Namespace, Name: p.Name, CgroupID: p.CgroupID})
	}
	st.Kubernetes = ks
	return st
}

// podCgroupDepth is how far below a pod's cgroup its sockets' cgroups are
// looked for (containers, and runtimes that nest a level), as the
// datapath's scope looks up (bpf/shortcut/scope.h EZ_SCOPE_DEPTH).
const podCgroupDepth = 3

// connections lists the datapath's connections as the listing walks them
// (streamed to the asker), each end named by its socket's cgroup where that
// is a selected pod's (proven by the kernel's socket, not inferred from an
// address). The walk stops when the asker goes away (ctx).
func (a *agent) connections(ctx context.Context, emit func(datapath.Connection) error) (datapath.Listing, error) {
	if a.pods == nil {
		return datapath.StreamConnections(ctx, a.cfg.Datapath, emit)
	}
	names := map[uint64]string{}
	for _, p := range a.pods.Pods() {
		name := fmt.Sprintf("%s/%s", p.Namespace, p.Name)
		names[p.CgroupID] = name
		// Sockets live in the containers' cgroups, below the pod's.
		for _, id := range cgroupv2.Descendants(p.CgroupPath, podCgroupDepth) {
			names[id] = name
		}
	}
	return datapath.StreamConnections(ctx, a.cfg.Datapath, func(c datapath.Connection) error {
		c.Pod = names[c.CgroupID]
		return emit(c)
	})
}
