package kube

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/eztunnel/eztunnel/internal/kubeapi"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// PodIPs is a pod of this node with its own network namespace and the
// addresses the API gives it (status.podIPs), as the host network side
// (the bypass's managed neighbours) takes them.
type PodIPs = podnet.PodAddrs

// NodePodIPs lists the pods of node in pods that are running or pending
// (not succeeded, failed or being deleted), not hostNetwork, with at least
// one address, sorted by namespace/name; unparsable addresses are left out.
func NodePodIPs(pods []any, node string) []PodIPs {
	var out []PodIPs
	for _, obj := range pods {
		p, ok := obj.(*kubeapi.Pod)
		if !ok || p.Spec.NodeName != node || p.Spec.HostNetwork || p.DeletionTimestamp != nil ||
			p.Status.Phase == kubeapi.PodSucceeded || p.Status.Phase == kubeapi.PodFailed {
			continue
		}
		var ips []netip.Addr
		for _, a := range p.Status.PodIPs {
			if ip, err := netip.ParseAddr(a.IP); err == nil {
				ips = append(ips, ip.Unmap())
			}
		}
		if len(ips) == 0 {
			continue
		}
		slices.SortFunc(ips, netip.Addr.Compare)
		var bw []string
		for _, k := range podnet.BandwidthAnnotations {
			if v, ok := p.Annotations[k]; ok {
				bw = append(bw, k+"="+v)
			}
		}
		out = append(out, PodIPs{Namespace: p.Namespace, Name: p.Name, IPs: slices.Compact(ips), Bandwidth: strings.Join(bw, ", ")})
	}
	slices.SortFunc(out, func(a, b PodIPs) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// feedPodIPs gives cfg.PodIPs the node's pod addresses when they changed
// (the first time always).
func (r *reconciler) feedPodIPs() {
	if r.cfg.PodIPs == nil {
		return
	}
	cur := NodePodIPs(r.pods.List(), r.cfg.NodeName)
	if r.podIPs != nil && slices.EqualFunc(cur, r.podIPs, func(a, b PodIPs) bool {
		return a.Namespace == b.Namespace && a.Name == b.Name && slices.Equal(a.IPs, b.IPs) && a.Bandwidth == b.Bandwidth
	}) {
		return
	}
	if cur == nil {
		cur = []PodIPs{}
	}
	r.podIPs = cur
	r.cfg.PodIPs(cur)
}
