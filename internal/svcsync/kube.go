package svcsync

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

// Families are the IP families the node serves.
type Families struct{ IPv4, IPv6 bool }

func (f Families) has(a netip.Addr) bool {
	if a.Unmap().Is4() {
		return f.IPv4
	}
	return f.IPv6
}

// ServiceEntries are the ClusterIP frontends of svc with the backends kube-proxy
// would use, and its sessionAffinity ClientIP timeout: per port, the ready endpoints of the matching EndpointSlice
// ports, or when none is ready the serving terminating ones. Skipped
// parts are reported by reason; svc nil (deleted), headless and
// ExternalName Services have no frontends. Topology hints are not applied.
func ServiceEntries(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, fam Families) (Entries, []string) {
	return ServiceEntriesOn(svc, slices, fam, "")
}

// ServiceEntriesOn is ServiceEntries on the node named node: a NodePort
// (Services of type NodePort and LoadBalancer) is a frontend too, whose
// backends with externalTrafficPolicy Local are the endpoints on that node
// (by the endpoints' nodeName) and keep the client's source.
func ServiceEntriesOn(svc *corev1.Service, slices []*discoveryv1.EndpointSlice, fam Families, node string) (Entries, []string) {
	if svc == nil || svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	if len(ips) == 0 || ips[0] == corev1.ClusterIPNone {
		return nil, nil // headless: nothing to translate
	}
	if len(svc.Spec.Ports) == 0 {
		return nil, []string{SkipNoPorts}
	}
	var skipped []string
	var affinity time.Duration
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		affinity = time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
		affinity = min(max(affinity, 0), lb.MaxAffinity)
	}
	e := Entries{}
	for _, s := range ips {
		vip, err := netip.ParseAddr(s)
		if err != nil || vip.Zone() != "" {
			skipped = append(skipped, SkipBadAddress)
			continue
		}
		vip = vip.Unmap()
		if !fam.has(vip) {
			skipped = append(skipped, SkipFamily)
			continue
		}
		addrType := discoveryv1.AddressTypeIPv4
		if vip.Is6() {
			addrType = discoveryv1.AddressTypeIPv6
		}
		for _, p := range svc.Spec.Ports {
			var proto lb.Proto
			switch p.Protocol {
			case corev1.ProtocolTCP, "": // the API defaults it to TCP
				proto = lb.TCP
			case corev1.ProtocolUDP:
				proto = lb.UDP
			default:
				skipped = append(skipped, SkipProtocol)
				continue
			}
			if p.Port <= 0 || p.Port > 65535 {
				skipped = append(skipped, SkipBadAddress)
				continue
			}
			f := lb.Frontend{Addr: vip, Port: uint16(p.Port), Proto: proto}
			chosen, listed, local := backends(slices, addrType, p, f.Addr.Is4(), node)
			e[f] = lb.Target{Backends: chosen, Listed: listed, Affinity: affinity}
			if p.NodePort > 0 && p.NodePort <= 65535 && (svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer) {
				np := lb.Frontend{Addr: netip.IPv4Unspecified(), Port: uint16(p.NodePort), Proto: proto, NodePort: true}
				if vip.Is6() {
					np.Addr = netip.IPv6Unspecified()
				}
				if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
					e[np] = lb.Target{Backends: local, KeepSource: true}
				} else {
					e[np] = lb.Target{Backends: chosen}
				}
			}
		}
	}
	return e, skipped
}

// backends are the endpoints of the slices' port named like p that
// connections go to, and the others the slices list (not ready, not
// serving): their TCP connections are left alone when they leave.
func backends(slices []*discoveryv1.EndpointSlice, at discoveryv1.AddressType, p corev1.ServicePort, v4 bool, node string) (chosen, listed, local []lb.Backend) {
	var ready, terminating, other []lb.Backend
	onNode := map[lb.Backend]bool{}
	for _, sl := range slices {
		if sl.AddressType != at {
			continue
		}
		port := -1
		for _, sp := range sl.Ports {
			name := ""
			if sp.Name != nil {
				name = *sp.Name
			}
			proto := corev1.ProtocolTCP
			if sp.Protocol != nil {
				proto = *sp.Protocol
			}
			if name == p.Name && (proto == p.Protocol || p.Protocol == "" && proto == corev1.ProtocolTCP) && sp.Port != nil {
				port = int(*sp.Port)
				break
			}
		}
		if port <= 0 || port > 65535 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			a, err := netip.ParseAddr(ep.Addresses[0]) // kube-proxy uses the first
			if err != nil || a.Unmap().Is4() != v4 {
				continue
			}
			c := ep.Conditions
			isReady := c.Ready == nil || *c.Ready
			serving := c.Serving == nil || *c.Serving
			term := c.Terminating != nil && *c.Terminating
			be := netip.AddrPortFrom(a.Unmap(), uint16(port))
			if node != "" && ep.NodeName != nil && *ep.NodeName == node {
				onNode[be] = true
			}
			switch {
			case isReady:
				ready = append(ready, be)
			case serving && term:
				terminating = append(terminating, be)
			default:
				other = append(other, be)
			}
		}
	}
	if len(ready) > 0 {
		chosen, listed = ready, append(terminating, other...)
	} else {
		chosen, listed = terminating, other
	}
	for _, b := range chosen {
		if onNode[b] {
			local = append(local, b)
		}
	}
	return chosen, listed, local
}

// KubeConfig configures RunKube.
type KubeConfig struct {
	REST     *rest.Config
	Families Families
	NodeName string       // the node's name: its endpoints are the local ones of externalTrafficPolicy Local
	Log      *slog.Logger // nil: slog.Default()
}

// FirstSyncTimeout bounds RunKube's wait for the informers' first list.
const FirstSyncTimeout = time.Minute

// RunKube watches Services and EndpointSlices of all namespaces and applies
// each changed Service to t. It returns once the caches synced and the
// first state is applied; watching goes on until ctx ends.
func RunKube(ctx context.Context, cfg KubeConfig, t *Table) error {
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	cs, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return fmt.Errorf("services: kubernetes client: %w", err)
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	svcInf := f.Core().V1().Services()
	sliceInf := f.Discovery().V1().EndpointSlices()
	k := &kubeSource{t: t, fam: cfg.Families, node: cfg.NodeName, log: log, svcs: svcInf.Lister(), slices: sliceInf.Lister(),
		pending: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	svcKey := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.enqueue(key)
		}
	}
	sliceKey := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		sl, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		if name := sl.Labels[discoveryv1.LabelServiceName]; name != "" {
			k.enqueue(sl.Namespace + "/" + name)
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{{svcInf.Informer(), svcKey}, {sliceInf.Informer(), sliceKey}} {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    h.fn,
			UpdateFunc: func(_, n any) { h.fn(n) },
			DeleteFunc: h.fn,
		}); err != nil {
			return fmt.Errorf("services: informer: %w", err)
		}
	}
	f.Start(ctx.Done())
	sctx, cancel := context.WithTimeout(ctx, FirstSyncTimeout)
	defer cancel()
	for typ, ok := range f.WaitForCacheSync(sctx.Done()) {
		if !ok {
			f.Shutdown()
			return fmt.Errorf("services: %v informer did not sync in %v (is the API server reachable, may this identity list and watch services and endpointslices?): %w",
				typ, FirstSyncTimeout, context.Cause(sctx))
		}
	}
	k.drain()
	log.Info("services: watching Services and EndpointSlices", "frontends_of", len(t.Names()))
	go func() {
		defer f.Shutdown()
		for {
			select {
			case <-ctx.Done():
				return
			case <-k.wake:
				k.drain()
			}
		}
	}()
	return nil
}

type kubeSource struct {
	t       *Table
	fam     Families
	node    string
	log     *slog.Logger
	svcs    corelisters.ServiceLister
	slices  discoverylisters.EndpointSliceLister
	mu      sync.Mutex
	pending map[string]time.Time // Service key -> first change not applied yet
	wake    chan struct{}
}

func (k *kubeSource) enqueue(key string) {
	k.mu.Lock()
	if _, ok := k.pending[key]; !ok {
		k.pending[key] = time.Now()
	}
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// drain applies every pending Service from the informers' caches.
func (k *kubeSource) drain() {
	k.mu.Lock()
	pending := k.pending
	k.pending = map[string]time.Time{}
	k.mu.Unlock()
	for key, since := range pending {
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			continue
		}
		svc, err := k.svcs.Services(ns).Get(name)
		if err != nil {
			svc = nil // deleted (NotFound is the only error of a cache lister)
		}
		var sls []*discoveryv1.EndpointSlice
		if svc != nil {
			sel := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name})
			if sls, err = k.slices.EndpointSlices(ns).List(sel); err != nil {
				k.log.Warn("services: list EndpointSlices", "service", key, "err", err)
			}
		}
		e, skipped := ServiceEntriesOn(svc, sls, k.fam, k.node)
		if len(skipped) > 0 {
			k.log.Warn("services: Service partly or wholly skipped", "service", key, "reasons", skipped)
		}
		k.t.Apply(key, e, skipped, since)
	}
}
