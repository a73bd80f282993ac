package kube

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// Decision is why a pod is selected or not.
type Decision struct {
	Selected bool
	Reason   string
}

// policy evaluates the selection rules and logs each invalid value once per
// object and key (and again only if the value changes).
type policy struct {
	def     Policy
	selfUID string
	log     *slog.Logger

	mu     sync.Mutex
	warned map[string]map[string]string // object -> key -> invalid value already logged
}

func newPolicy(cfg Config) *policy {
	return &policy{def: cfg.defaultPolicy(), selfUID: cfg.SelfUID, log: cfg.logger(), warned: map[string]map[string]string{}}
}

// value reads key from m; an invalid value is logged and treated as unset.
// object is "pod <ns>/<name>" or "namespace <name>", built only when needed.
func (p *policy) value(m map[string]string, key, kind, prefix, ns, name string) Policy {
	v, ok := m[key]
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
	seen, logged := p.warned[object][key]
	if p.warned[object] == nil {
		p.warned[object] = map[string]string{}
	}
	p.warned[object][key] = v
	p.mu.Unlock()
	if !logged || seen != v {
		p.log.Warn("kubernetes: invalid "+kind+" value, ignored", "object", object, "key", key, "value", v,
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

// decide applies the rules. The operator decides, a pod only narrows:
//  1. host-network pods and the agent's own pod are never selected (their
//     annotation is not read: a host-network pod's sockets are the node's),
//     nor pods with a bandwidth annotation (podnet.BandwidthAnnotations):
//     the bandwidth CNI plugin shapes them at their veth, which redirected
//     bytes never cross, so the shortcut would lift the operator's limit;
//  2. a namespace labelled Key=disabled selects none of its pods, whatever
//     their annotation says;
//  3. a pod annotated Key=disabled is not selected (opting out is always
//     allowed);
//  4. a pod annotated Key=enabled is selected only in a namespace labelled
//     OptInKey=enabled (the namespace allows its pods to opt in);
//     elsewhere the annotation is ignored;
//  5. then the namespace label Key, then the default policy.
//
// ns may be nil (namespace not known yet): no pod can opt in then.
func (p *policy) decide(pod *kubeapi.Pod, ns *kubeapi.Namespace) Decision {
	if pod.Spec.HostNetwork {
		return Decision{false, "host network"}
	}
	if p.selfUID != "" && string(pod.UID) == p.selfUID {
		return Decision{false, "agent's own pod"}
	}
	for _, k := range podnet.BandwidthAnnotations {
		if _, shaped := pod.Annotations[k]; shaped {
			return Decision{false, "bandwidth annotation"}
		}
	}
	var label, optIn Policy
	if ns != nil {
		label = p.value(ns.Labels, Key, "namespace label", "namespace ", "", ns.Name)
		if label == Disabled {
			return Decision{false, "namespace label"}
		}
	}
	switch p.value(pod.Annotations, Key, "pod annotation", "pod ", pod.Namespace, pod.Name) {
	case Disabled:
		return Decision{false, "pod annotation"}
	case Enabled:
		if ns != nil {
			optIn = p.value(ns.Labels, OptInKey, "namespace label", "namespace ", "", ns.Name)
		}
		if optIn == Enabled {
			return Decision{true, "pod annotation"}
		}
	}
	switch label {
	case Enabled:
		return Decision{true, "namespace label"}
	}
	return Decision{p.def == Enabled, "default policy"}
}
