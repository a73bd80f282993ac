package kube

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// Decision is why a pod is selected or not.
type Decision struct {
	Selected bool
	Reason   string
}

// policy evaluates the selection rules and logs each invalid value once per
// object (and again only if the value changes).
type policy struct {
	def     Policy
	selfUID string
	log     *slog.Logger

	mu     sync.Mutex
	warned map[string]string // object -> invalid value already logged
}

func newPolicy(cfg Config) *policy {
	return &policy{def: cfg.defaultPolicy(), selfUID: cfg.SelfUID, log: cfg.logger(), warned: map[string]string{}}
}

// value reads Key from m; an invalid value is logged and treated as unset.
// object is "pod <ns>/<name>" or "namespace <name>", built only when needed.
func (p *policy) value(m map[string]string, kind, prefix, ns, name string) Policy {
	v, ok := m[Key]
	if !ok {
		return ""
	}
	switch Policy(v) {
	case Enabled, Disabled:
		return Policy(v)
	}
	object := prefix + name
	if ns != "" {
		object = prefix + ns + "/" + name
	}
	p.mu.Lock()
	seen, logged := p.warned[object]
	p.warned[object] = v
	p.mu.Unlock()
	if !logged || seen != v {
		p.log.Warn("kubernetes: invalid "+kind+" value, ignored", "object", object, "key", Key, "value", v,
			"want", fmt.Sprintf("%s|%s", Enabled, Disabled))
	}
	return ""
}

// forget drops the warning memory of a deleted object.
func (p *policy) forget(object string) {
	p.mu.Lock()
	delete(p.warned, object)
	p.mu.Unlock()
}

// decide applies the rules: the pod annotation overrides everything; host-network
// pods and the agent's own pod are excluded otherwise; then the namespace
// label; then the default. ns may be nil (namespace not known).
func (p *policy) decide(pod *kubeapi.Pod, ns *kubeapi.Namespace) Decision {
	switch p.value(pod.Annotations, "pod annotation", "pod ", pod.Namespace, pod.Name) {
	case Enabled:
		return Decision{true, "pod annotation"}
	case Disabled:
		return Decision{false, "pod annotation"}
	}
	if pod.Spec.HostNetwork {
		return Decision{false, "host network"}
	}
	if p.selfUID != "" && string(pod.UID) == p.selfUID {
		return Decision{false, "agent's own pod"}
	}
	if ns != nil {
		switch p.value(ns.Labels, "namespace label", "namespace ", "", ns.Name) {
		case Enabled:
			return Decision{true, "namespace label"}
		case Disabled:
			return Decision{false, "namespace label"}
		}
	}
	return Decision{p.def == Enabled, "default policy"}
}
