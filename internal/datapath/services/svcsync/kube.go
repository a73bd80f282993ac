package svcsync

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/kube"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// Families are the IP families the node serves.
type Families struct{ IPv4, IPv6 bool }

func (f Families) has(a netip.Addr) bool {
	if a.Unmap().Is4() {
		return f.IPv4
	}
	return f.IPv6
}

// Topology is the node the frontends are made for: its endpoints (by the
// endpoints' nodeName) are the local ones, and its topology zone (the
// node's topology.kubernetes.io/zone label) selects zone hints.
type Topology struct{ Name, Zone string }

// serviceEntries are the ClusterIP (and NodePort) frontends of svc on node
// with the backends kube-proxy would use, and its sessionAffinity ClientIP
// timeout: per port, the ready endpoints of the matching EndpointSlice
// ports, or when none is ready the serving terminating ones. Skipped parts
// are reported by reason; svc nil (deleted), headless and ExternalName
// Services have no frontends. Topology{} has no local endpoints and no zone.
// kube-proxy's choice of endpoints (pkg/proxy/topology.go,
// CategorizeEndpoints, v1.33):
//   - Cluster policy: the ready endpoints, narrowed to those hinted for the
//     node's zone when every ready endpoint has a zone hint and one is for
//     this zone; none ready: the serving terminating ones (no topology).
//   - Local policy: the node's ready endpoints, else its serving
//     terminating ones.
//
// The ClusterIP uses Local with internalTrafficPolicy Local, else Cluster.
// A NodePort (Services of type NodePort and LoadBalancer) is a frontend
// too: with externalTrafficPolicy Local its backends are Local and keep the
// client's source, else Cluster. Node hints (ForNodes) are not used: their
// kube-proxy feature gate (PreferSameTrafficDistribution) is alpha and off
// in v1.33.
func serviceEntries(svc *kubeapi.Service, slices []*kubeapi.EndpointSlice, fam Families, node Topology) (Entries, []string) {
	if svc == nil || svc.Spec.Type == kubeapi.ServiceTypeExternalName {
		return nil, nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	if len(ips) == 0 || ips[0] == kubeapi.ClusterIPNone {
		return nil, nil // headless: nothing to translate
	}
	if len(svc.Spec.Ports) == 0 {
		return nil, []string{SkipNoPorts}
	}
	var skipped []string
	var affinity time.Duration
	if svc.Spec.SessionAffinity == kubeapi.ServiceAffinityClientIP {
		affinity = time.Duration(kubeapi.DefaultClientIPServiceAffinitySeconds) * time.Second
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			affinity = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
		affinity = min(max(affinity, 0), lb.MaxAffinity)
	}
	internalLocal := svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == kubeapi.ServiceInternalTrafficPolicyLocal
	externalLocal := svc.Spec.ExternalTrafficPolicy == kubeapi.ServiceExternalTrafficPolicyLocal
	hasNodePorts := svc.Spec.Type == kubeapi.ServiceTypeNodePort || svc.Spec.Type == kubeapi.ServiceTypeLoadBalancer
	e := Entries{}
	// addPorts adds vip's frontend of every port; external (ExternalIPs,
	// load-balancer IPs): cluster endpoints whatever the policies, as
	// kube-proxy routes pods' and the node's own traffic to them (its
	// "short-circuit" of external destinations), and no NodePort.
	addPorts := func(vip netip.Addr, external bool) {
		addrType := kubeapi.AddressTypeIPv4
		if vip.Is6() {
			addrType = kubeapi.AddressTypeIPv6
		}
		for _, p := range svc.Spec.Ports {
			var proto lb.Proto
			switch p.Protocol {
			case kubeapi.ProtocolTCP, "": // the API defaults it to TCP
				proto = lb.TCP
			case kubeapi.ProtocolUDP:
				proto = lb.UDP
			default:
				skipped = append(skipped, SkipProtocol)
				continue
			}
			if p.Port <= 0 || p.Port > 65535 {
				skipped = append(skipped, SkipBadAddress)
				continue
			}
			eps := endpoints(slices, addrType, p, vip.Is4(), node.Name)
			cluster, local := categorize(eps, node.Zone)
			f := lb.Frontend{Addr: vip, Port: uint16(p.Port), Proto: proto}
			chosen := cluster
			if internalLocal && !external {
				chosen = local
			}
			e[f] = lb.Target{Backends: chosen, Listed: others(eps, chosen), Affinity: affinity, External: external}
			if p.NodePort > 0 && p.NodePort <= 65535 && hasNodePorts && !external {
				np := lb.Frontend{Addr: netip.IPv4Unspecified(), Port: uint16(p.NodePort), Proto: proto, NodePort: true}
				if vip.Is6() {
					np.Addr = netip.IPv6Unspecified()
				}
				if externalLocal {
					e[np] = lb.Target{Backends: local, KeepSource: true}
				} else {
					e[np] = lb.Target{Backends: cluster}
				}
			}
		}
	}
	external, extSkipped := externalAddrs(svc)
	skipped = append(skipped, extSkipped...)
	for i, s := range append(ips, external...) {
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
		addPorts(vip, i >= len(ips))
	}
	return e, skipped
}

// externalAddrs are a Service's ExternalIPs and its load-balancer IPs
// (status.loadBalancer.ingress) the cluster's traffic is translated to: not
// those of ipMode Proxy (the load balancer proxies; kube-proxy leaves them
// to it too, SkipLBProxy), not hostnames.
func externalAddrs(svc *kubeapi.Service) (addrs, skipped []string) {
	addrs = append(addrs, svc.Spec.ExternalIPs...)
	if svc.Spec.Type != kubeapi.ServiceTypeLoadBalancer {
		return addrs, nil
	}
	for _, in := range svc.Status.LoadBalancer.Ingress {
		switch {
		case in.IP == "":
		case in.IPMode != nil && *in.IPMode == kubeapi.LoadBalancerIPModeProxy:
			skipped = append(skipped, SkipLBProxy)
		default:
			addrs = append(addrs, in.IP)
		}
	}
	return addrs, skipped
}

// endpoint is one endpoint of a Service port, as kube-proxy sees it.
type endpoint struct {
	be                          lb.Backend
	ready, serving, terminating bool
	local                       bool
	zones                       []string // hints.forZones
}

// endpoints are the endpoints of the slices' port named like p, of the
// family v4 says, each once (kube-proxy keeps the first address of an
// endpoint, and favours a local copy of one listed twice).
func endpoints(slices []*kubeapi.EndpointSlice, at kubeapi.AddressType, p kubeapi.ServicePort, v4 bool, node string) []endpoint {
	var eps []endpoint
	index := map[lb.Backend]int{}
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
			proto := kubeapi.ProtocolTCP
			if sp.Protocol != nil {
				proto = *sp.Protocol
			}
			if name == p.Name && (proto == p.Protocol || p.Protocol == "" && proto == kubeapi.ProtocolTCP) && sp.Port != nil {
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
			e := endpoint{
				be:          netip.AddrPortFrom(a.Unmap(), uint16(port)),
				ready:       c.Ready == nil || *c.Ready,
				serving:     c.Serving == nil || *c.Serving,
				terminating: c.Terminating != nil && *c.Terminating,
				local:       node != "" && ep.NodeName != nil && *ep.NodeName == node,
			}
			if ep.Hints != nil {
				for _, z := range ep.Hints.ForZones {
					e.zones = append(e.zones, z.Name)
				}
			}
			if i, ok := index[e.be]; ok {
				if e.local {
					eps[i] = e
				}
				continue
			}
			index[e.be] = len(eps)
			eps = append(eps, e)
		}
	}
	return eps
}

// categorize is kube-proxy's CategorizeEndpoints: the endpoints of the
// Cluster policy (with zone topology) and of the Local policy.
func categorize(eps []endpoint, zone string) (cluster, local []lb.Backend) {
	// Zone hints apply when every ready endpoint has one and one is for
	// this zone (a node without the label has zone "": no hint matches).
	useZone, allHinted, anyForZone := false, true, false
	for _, e := range eps {
		if !e.ready {
			continue
		}
		if len(e.zones) == 0 {
			allHinted = false
		} else if slices.Contains(e.zones, zone) {
			anyForZone = true
		}
	}
	useZone = len(eps) > 0 && allHinted && anyForZone
	for _, e := range eps {
		if e.ready && (!useZone || slices.Contains(e.zones, zone)) {
			cluster = append(cluster, e.be)
		}
	}
	if len(cluster) == 0 {
		for _, e := range eps {
			if e.serving && e.terminating {
				cluster = append(cluster, e.be)
			}
		}
	}
	for _, e := range eps {
		if e.local && e.ready {
			local = append(local, e.be)
		}
	}
	if len(local) == 0 {
		for _, e := range eps {
			if e.local && e.serving && e.terminating {
				local = append(local, e.be)
			}
		}
	}
	return cluster, local
}

// others are the endpoints not chosen: their TCP connections are left
// alone when they leave the chosen (not ready, terminating, another zone,
// another node).
func others(eps []endpoint, chosen []lb.Backend) []lb.Backend {
	var o []lb.Backend
	for _, e := range eps {
		if !slices.Contains(chosen, e.be) {
			o = append(o, e.be)
		}
	}
	return o
}

// KubeConfig configures RunKube.
type KubeConfig struct {
	REST     *rest.Config
	Families Families
	// NodeName is the node's name: its endpoints are the local ones of the
	// Local traffic policies, and its topology.kubernetes.io/zone label
	// (watched: needs get, list and watch on nodes) selects zone hints.
	// Empty: no local endpoints, no zone.
	NodeName string
	// Health serves the healthCheckNodePorts of the node's Services (nil:
	// none).
	Health *HealthServer
	Log    *slog.Logger // nil: slog.Default()
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
	t0 := time.Now()
	lw, err := kube.NewListWatches(cfg.REST)
	if err != nil {
		return fmt.Errorf("services: %w", err)
	}
	svcInf := cache.NewSharedIndexInformer(lw.Services(), &kubeapi.Service{}, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	// EndpointSlices by their Service: a namespace list would walk every
	// slice of the namespace for each Service (10,000 Services in one
	// namespace: 10,000 walks of 20,000 slices at the first sync).
	sliceInf := cache.NewSharedIndexInformer(lw.EndpointSlices(), &kubeapi.EndpointSlice{}, 0,
		cache.Indexers{sliceServiceIndex: sliceService})
	for _, inf := range []cache.SharedIndexInformer{svcInf, sliceInf} {
		if err := inf.SetTransform(trimMeta); err != nil {
			return fmt.Errorf("services: informer: %w", err)
		}
	}
	k := &kubeSource{t: t, fam: cfg.Families, node: Topology{Name: cfg.NodeName}, health: cfg.Health, log: log,
		svcs: svcInf.GetIndexer(), slices: sliceInf.GetIndexer(),
		pending: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	informersOf := []cache.SharedIndexInformer{svcInf, sliceInf}
	var nodeInf cache.SharedIndexInformer
	if cfg.NodeName != "" {
		// The node's zone label: a change re-applies every Service.
		nodeInf = cache.NewSharedIndexInformer(lw.Node(cfg.NodeName), &kubeapi.Node{}, 0, cache.Indexers{})
		onNode := func(obj any) {
			n, ok := obj.(*kubeapi.Node)
			if !ok {
				return // deleted: keep the last zone
			}
			k.setZone(n.Labels[kubeapi.LabelTopologyZone])
		}
		if _, err := nodeInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    onNode,
			UpdateFunc: func(_, n any) { onNode(n) },
		}); err != nil {
			return fmt.Errorf("services: node informer: %w", err)
		}
		informersOf = append(informersOf, nodeInf)
	}
	svcKey := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.enqueue(key)
		}
	}
	sliceKey := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		sl, ok := obj.(*kubeapi.EndpointSlice)
		if !ok {
			return
		}
		if name := sl.Labels[kubeapi.LabelServiceName]; name != "" {
			k.enqueue(sl.Namespace + "/" + name)
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{{svcInf, svcKey}, {sliceInf, sliceKey}} {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    h.fn,
			UpdateFunc: func(_, n any) { h.fn(n) },
			DeleteFunc: h.fn,
		}); err != nil {
			return fmt.Errorf("services: informer: %w", err)
		}
	}
	// The informers run until ictx ends: ctx's end, or a failed first sync.
	ictx, stop := context.WithCancel(ctx)
	for _, inf := range informersOf {
		go inf.RunWithContext(ictx)
	}
	shutdown := stop
	sctx, cancel := context.WithTimeout(ctx, FirstSyncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), func() bool {
		for _, inf := range informersOf {
			if !inf.HasSynced() {
				return false
			}
		}
		return true
	}) {
		shutdown()
		return fmt.Errorf("services: informers did not sync in %v (is the API server reachable, may this identity list and watch services, endpointslices and its node %q?): %w",
			FirstSyncTimeout, cfg.NodeName, context.Cause(sctx))
	}
	if nodeInf != nil {
		// The handlers may not have seen the node yet: read it now.
		if o, ok, err := nodeInf.GetStore().GetByKey(cfg.NodeName); err == nil && ok {
			if n, ok := o.(*kubeapi.Node); ok {
				k.setZone(n.Labels[kubeapi.LabelTopologyZone])
			}
		}
	}
	listed := time.Since(t0)
	n := k.drain()
	log.Info("services: watching Services and EndpointSlices", "frontends_of", len(t.Names()),
		"services", len(svcInf.GetStore().ListKeys()), "endpointslices", len(sliceInf.GetStore().ListKeys()),
		"listed_seconds", listed.Seconds(), "applied", n, "applied_seconds", (time.Since(t0) - listed).Seconds())
	go func() {
		defer shutdown()
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

// trimMeta drops the metadata the load balancer never reads (managed
// fields; annotations, such as kubectl's last applied configuration): the
// caches of 10,000 Services and their EndpointSlices hold less.
func trimMeta(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
		m.SetAnnotations(nil)
	}
	return obj, nil
}

// sliceServiceIndex indexes EndpointSlices by their Service's key
// (namespace/name, from the kubernetes.io/service-name label).
const sliceServiceIndex = "service"

func sliceService(obj any) ([]string, error) {
	sl, ok := obj.(*kubeapi.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := sl.Labels[kubeapi.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{sl.Namespace + "/" + name}, nil
}

// slicesOf are the cached EndpointSlices of the Service key.
func slicesOf(idx cache.Indexer, key string) ([]*kubeapi.EndpointSlice, error) {
	objs, err := idx.ByIndex(sliceServiceIndex, key)
	if err != nil {
		return nil, err
	}
	out := make([]*kubeapi.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if sl, ok := o.(*kubeapi.EndpointSlice); ok {
			out = append(out, sl)
		}
	}
	// The index is a set (no order, nor was the lister's): sorted by name,
	// the copy kept of an endpoint listed twice in two slices is the same
	// from one sync to the next.
	slices.SortFunc(out, func(a, b *kubeapi.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

type kubeSource struct {
	t       *Table
	fam     Families
	node    Topology // Zone under mu
	health  *HealthServer
	log     *slog.Logger
	svcs    cache.Indexer // Services by namespace/name
	slices  cache.Indexer // EndpointSlices, indexed by sliceServiceIndex
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

// setZone takes the node's zone; a change re-applies every Service.
func (k *kubeSource) setZone(zone string) {
	k.mu.Lock()
	changed := k.node.Zone != zone
	k.node.Zone = zone
	k.mu.Unlock()
	if !changed {
		return
	}
	k.log.Info("services: the node's topology zone", "zone", zone)
	for _, key := range k.svcs.ListKeys() {
		k.enqueue(key)
	}
}

// drain applies every pending Service from the informers' caches and
// returns how many it applied.
func (k *kubeSource) drain() int {
	k.mu.Lock()
	pending := k.pending
	k.pending = map[string]time.Time{}
	node := k.node
	k.mu.Unlock()
	for key, since := range pending {
		var svc *kubeapi.Service // nil: deleted
		if o, ok, _ := k.svcs.GetByKey(key); ok {
			svc, _ = o.(*kubeapi.Service)
		}
		var err error
		var sls []*kubeapi.EndpointSlice
		if svc != nil {
			if sls, err = slicesOf(k.slices, key); err != nil {
				k.log.Warn("services: list EndpointSlices", "service", key, "err", err)
			}
		}
		e, skipped := serviceEntries(svc, sls, k.fam, node)
		if len(skipped) > 0 {
			k.log.Warn("services: Service partly or wholly skipped", "service", key, "reasons", skipped)
		}
		k.t.Apply(key, e, skipped, since)
		if hc, ok := HealthCheckOn(svc, sls, node.Name); ok {
			k.health.Set(key, &hc)
		} else {
			k.health.Set(key, nil)
		}
	}
	return len(pending)
}
