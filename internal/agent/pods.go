package agent

import (
	"context"
	"errors"
	"time"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/metrics"
)

// KubeConfig configures Kubernetes mode.
type KubeConfig struct {
	UninstallOnRemoval bool
	Drain              time.Duration
}

type podScope struct{ root string }

func newPodScope(KubeConfig) (*podScope, error) {
	return nil, errors.New("kubernetes mode: not built yet")
}

func (p *podScope) Pods() []metrics.Pod { return nil }

type kubeEvents struct {
	synced  <-chan struct{}
	removed <-chan struct{}
	failed  <-chan error
}

func (p *podScope) start(context.Context, *datapath.Datapath) (kubeEvents, error) {
	return kubeEvents{}, errors.New("not built")
}

func uninstallOnRemoval(context.Context, *datapath.Datapath, Config, *agentlock.Lock) error {
	return errors.New("not built")
}
