package main

import (
	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/agent"
)

// kubeFlags are the flags of Kubernetes mode (`run --kubernetes`).
type kubeFlags struct {
	enabled bool
}

func (k *kubeFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&k.enabled, "kubernetes", false, "Kubernetes mode: accelerate the selected pods of this node")
}

func (k *kubeFlags) parse() (*agent.KubeConfig, error) {
	if !k.enabled {
		return nil, nil
	}
	return &agent.KubeConfig{}, nil
}
