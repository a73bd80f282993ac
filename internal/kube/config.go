// Package kube selects the pods of one Kubernetes node for eztunnel: it
// watches the node's pods and all namespaces, applies the selection policy
// (namespace labels eztunnel.io/shortcut and eztunnel.io/shortcut-opt-in, pod
// annotation eztunnel.io/shortcut), maps each
// selected pod to its pod-level cgroup v2 directory and reports the desired
// set. It also tells when the agent's own DaemonSet is removed.
package kube

import (
	"errors"
	"fmt"
	"log/slog"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// Key is the namespace label and pod annotation that selects workloads.
const Key = "eztunnel.io/shortcut"

// OptInKey is the namespace label (value Enabled) that lets the namespace's
// pods select themselves with the annotation Key=enabled. Without it a pod's
// annotation can only opt out (policy.decide).
const OptInKey = "eztunnel.io/shortcut-opt-in"

// ServicesKey is the pod annotation of the Service load balancer's per-pod
// choice (internal/datapath/services/svcsync.ParseChoice): translate at the socket, or leave
// the pod to its proxy. Reported in Target.Services.
const ServicesKey = "eztunnel.io/services"

// Policy is a selection value: Enabled or Disabled.
type Policy string

const (
	Enabled  Policy = "enabled"
	Disabled Policy = "disabled"
)

// ParsePolicy parses "enabled" or "disabled" (the --default-policy flag).
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case Enabled, Disabled:
		return p, nil
	}
	return "", fmt.Errorf("unknown policy %q (want %q or %q)", s, Enabled, Disabled)
}

// Cgroup drivers (Config.Driver).
const (
	DriverAuto     = "auto"
	DriverCgroupfs = "cgroupfs"
	DriverSystemd  = "systemd"
)

// Target is a selected pod and its pod-level cgroup.
type Target struct {
	Namespace, Name, UID string
	CgroupID             uint64 // inode number of CgroupPath
	CgroupPath           string
	Services             string // the pod's ServicesKey annotation ("": none)
}

// Config configures Run, PodsRoot and WatchRemoval.
type Config struct {
	Kubeconfig string // "" = in-cluster config
	NodeName   string // required
	SelfUID    string // the agent's own pod UID ("" = none)
	Default    Policy // Enabled or Disabled; "" means Disabled

	Cgroup2Root string // cgroup2 mount; "" = the first cgroup2 mount in /proc/mounts
	PodsCgroup  string // kubepods dir (absolute, or relative to Cgroup2Root); "" = auto
	Driver      string // auto|cgroupfs|systemd; "" = auto

	// Select, when set, decides which pods are reported instead of the
	// selection policy (Key; Default and SelfUID unused): the Service load
	// balancer watches the pods with a ServicesKey annotation.
	Select func(*kubeapi.Pod) bool `json:"-"`

	Logger *slog.Logger `json:"-"` // nil = slog.Default()

	// PodIPs, if set, gets the node's pod addresses (podips.go) after each
	// change, never concurrently.
	PodIPs func([]PodIPs) `json:"-"`
}

// Validate checks the values that do not need the cluster or the host.
func (c Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("kubernetes: node name is empty (set --node-name or $NODE_NAME)"))
	}
	switch c.Default {
	case "", Enabled, Disabled:
	default:
		errs = append(errs, fmt.Errorf("kubernetes: unknown default policy %q (want %q or %q)", c.Default, Enabled, Disabled))
	}
	switch c.Driver {
	case "", DriverAuto, DriverCgroupfs, DriverSystemd:
	default:
		errs = append(errs, fmt.Errorf("kubernetes: unknown cgroup driver %q (want auto, cgroupfs or systemd)", c.Driver))
	}
	return errors.Join(errs...)
}

func (c Config) defaultPolicy() Policy {
	if c.Default == "" {
		return Disabled
	}
	return c.Default
}

func (c Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// RESTConfig returns the client configuration: cfg.Kubeconfig if set,
// otherwise the in-cluster configuration.
func RESTConfig(cfg Config) (*rest.Config, error) {
	if cfg.Kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: kubeconfig %q: %w", cfg.Kubeconfig, err)
		}
		return rc, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes: in-cluster config (or pass --kubeconfig): %w", err)
	}
	return rc, nil
}
