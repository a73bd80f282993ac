package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	"github.com/eztunnel/eztunnel/internal/kube"
	"github.com/eztunnel/eztunnel/internal/metrics"
)

// KubeConfig configures Kubernetes mode: the hooks are attached once at the
// pods' root cgroup and the selected pods' cgroups are kept in ez_sc_cgroups.
type KubeConfig struct {
	kube.Config
	PodNamespace, PodName string // the agent's own pod (downward API)
	// UninstallOnRemoval: when the agent's DaemonSet is deleted (helm
	// uninstall, not an update), drain and remove the datapath.
	UninstallOnRemoval bool
	Drain              time.Duration
}

// podScope keeps ez_sc_cgroups equal to the selected pods of this node.
type podScope struct {
	cfg   KubeConfig
	root  string
	watch *kube.PodWatch // the node's pods, shared with the Service load balancer

	mu   sync.Mutex
	pods []metrics.Pod // last applied selection, for the per-pod metrics
	// applied is called after each selection applied (nil: nothing is);
	// set before start.
	applied func()
}

// cgroupPaths are the cgroups of the last applied selection.
func (p *podScope) cgroupPaths() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod.CgroupPath)
	}
	return out
}

// check validates kc without the cluster or the node.
func (kc KubeConfig) check() error {
	if err := kc.Validate(); err != nil {
		return err
	}
	if kc.Drain < 0 {
		return fmt.Errorf("--drain-timeout %s must not be negative", kc.Drain)
	}
	if kc.UninstallOnRemoval && (kc.PodNamespace == "" || kc.PodName == "") {
		return errors.New("--uninstall-on-removal needs the agent's pod: set $POD_NAMESPACE and $POD_NAME (the chart does, from the downward API)")
	}
	return nil
}

func newPodScope(kc KubeConfig) (*podScope, error) {
	if err := kc.check(); err != nil {
		return nil, err
	}
	if kc.Drain == 0 {
		kc.Drain = 30 * time.Second
	}
	w, err := kube.NewPodWatch(kc.Config) // the API's configuration, the pods' cgroups
	if err != nil {
		return nil, err
	}
	return &podScope{cfg: kc, root: w.Layout().PodsRoot, watch: w}, nil
}

// Pods implements metrics.PodSource.
func (p *podScope) Pods() []metrics.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods
}

// kubeEvents is what the Kubernetes side tells the run loop.
type kubeEvents struct {
	synced  <-chan struct{} // the first selection is applied
	removed <-chan struct{} // our DaemonSet was deleted (nil without --uninstall-on-removal)
	removal *kube.Removal   // re-reads our DaemonSet (nil without --uninstall-on-removal)
	failed  <-chan error    // the watch could not run
}

// start watches the node's pods (for every consumer added to p.watch) and
// applies each desired set to dp.
func (p *podScope) start(ctx context.Context, dp *datapath.Datapath) (kubeEvents, error) {
	var ev kubeEvents
	if p.cfg.UninstallOnRemoval {
		removed, rm, err := kube.WatchRemoval(ctx, p.cfg.Config, p.cfg.PodNamespace, p.cfg.PodName)
		if err != nil {
			return ev, err
		}
		ev.removed, ev.removal = removed, rm
	}
	synced := make(chan struct{})
	failed := make(chan error, 1)
	ev.synced, ev.failed = synced, failed
	var once sync.Once
	apply := func(targets []kube.Target) error {
		ids := make([]uint64, 0, len(targets))
		pods := make([]metrics.Pod, 0, len(targets))
		for _, t := range targets {
			ids = append(ids, t.CgroupID)
			pods = append(pods, metrics.Pod{Namespace: t.Namespace, Name: t.Name, CgroupID: t.CgroupID, CgroupPath: t.CgroupPath})
		}
		added, removed, err := dp.SetScope(ids)
		if err != nil {
			return err
		}
		p.mu.Lock()
		p.pods = pods
		p.mu.Unlock()
		if added+removed > 0 {
			slog.Info("pod selection applied", "selected", len(ids), "added", added, "removed", removed)
		}
		if p.applied != nil {
			p.applied() // also when unchanged: a restarted agent covers the selection at once
		}
		return nil
	}
	p.watch.Add(ctx, p.cfg.Config, apply, func() { once.Do(func() { close(synced) }) })
	go func() {
		if err := p.watch.Run(ctx); err != nil {
			failed <- err
		}
	}()
	return ev, nil
}

// uninstallOnRemoval drains and removes the datapath once the agent's
// DaemonSet is gone, then stays up (not ready) until stopped: exiting would
// let the kubelet restart the container, and a restarted agent installs.
func uninstallOnRemoval(ctx context.Context, dp *datapath.Datapath, cfg Config, lock *agentlock.Lock) error {
	slog.Info("the agent's DaemonSet was deleted: draining and removing the datapath", "pins", cfg.Datapath.Dir(), "drain", cfg.Kubernetes.Drain)
	dp.Close()
	if err := datapath.Uninstall(cfg.Datapath, cfg.Kubernetes.Drain); err != nil {
		lock.Release()
		return fmt.Errorf("uninstall after the DaemonSet was deleted: %w", err)
	}
	bypass.RemoveManagedNeighbours()
	lock.Remove()
	slog.Info("uninstalled; waiting to be stopped")
	<-ctx.Done()
	return nil
}
