package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/agent"
	"github.com/eztunnel/eztunnel/internal/kube"
)

// kubeFlags are the flags of Kubernetes mode (`run --kubernetes`).
type kubeFlags struct {
	enabled   bool
	cfg       kube.Config
	policy    string
	uninstall bool
	drain     time.Duration
}

func (k *kubeFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&k.enabled, "kubernetes", false, "Kubernetes mode: attach once at the pods' root cgroup and accelerate the selected pods of this node")
	f.StringVar(&k.cfg.Kubeconfig, "kubeconfig", "", "kubeconfig file for --kubernetes and --services (default: the in-cluster configuration)")
	f.StringVar(&k.cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME)")
	f.StringVar(&k.policy, "default-policy", string(kube.Disabled), "pods whose namespace has no "+kube.Key+" label (a pod annotation opts out, or in where the namespace has "+kube.OptInKey+"=enabled): enabled or disabled")
	f.StringVar(&k.cfg.PodsCgroup, "pods-cgroup", "", "the pods' root cgroup (default: kubepods or kubepods.slice under the cgroup2 mount)")
	f.StringVar(&k.cfg.Cgroup2Root, "cgroup2-root", "", "the cgroup2 mount (default: the first in /proc/mounts)")
	f.StringVar(&k.cfg.Driver, "cgroup-driver", kube.DriverAuto, "the kubelet's cgroup driver: auto, cgroupfs or systemd")
	f.BoolVar(&k.uninstall, "uninstall-on-removal", false, "when this agent's DaemonSet is deleted (helm uninstall, not an update), drain and remove the datapath")
	f.DurationVar(&k.drain, "drain-timeout", 30*time.Second, "with --uninstall-on-removal: how long to wait for accelerated connections to close (as eztunnel uninstall --drain-timeout)")
	// The name before `run` and `uninstall` shared one, still accepted.
	f.DurationVar(&k.drain, "removal-drain-timeout", 30*time.Second, "")
	f.MarkDeprecated("removal-drain-timeout", "use --drain-timeout")
}

// parse: services says --services is on, which may use --kubeconfig too.
func (k *kubeFlags) parse(f *pflag.FlagSet, services bool) (*agent.KubeConfig, error) {
	if !k.enabled {
		if f.Changed("kubeconfig") && !services {
			return nil, fmt.Errorf("--kubeconfig needs --kubernetes or --services")
		}
		for _, name := range []string{"default-policy", "pods-cgroup", "cgroup2-root", "cgroup-driver", "uninstall-on-removal", "drain-timeout", "removal-drain-timeout"} {
			if f.Changed(name) {
				return nil, fmt.Errorf("--%s needs --kubernetes", name)
			}
		}
		return nil, nil
	}
	p, err := kube.ParsePolicy(k.policy)
	if err != nil {
		return nil, fmt.Errorf("--default-policy: %v", err)
	}
	k.cfg.Default = p
	k.cfg.SelfUID = os.Getenv("POD_UID")
	return &agent.KubeConfig{
		Config:       k.cfg,
		PodNamespace: os.Getenv("POD_NAMESPACE"), PodName: os.Getenv("POD_NAME"),
		UninstallOnRemoval: k.uninstall, Drain: k.drain,
	}, nil
}
