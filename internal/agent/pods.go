package agent

import (
	"context"
	"errors"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
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

func (p *podScope) start(context.Context, *datapath.Datapath) (<-chan struct{}, <-chan struct{}, error) {
	return nil, nil, errors.New("not built")
}

func uninstallOnRemoval(context.Context, *datapath.Datapath, Config, interface{ Release() error }) error {
	return errors.New("not built")
}
