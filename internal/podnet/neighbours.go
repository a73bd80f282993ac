package podnet

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/eztunnel/eztunnel/internal/rtnl"
)

// PodAddrs is a pod of this node with its own network namespace and the
// addresses the API gives it (PodAddrs).
type PodAddrs struct {
	Namespace, Name string
	IPs             []netip.Addr
	// Bandwidth: the pod's bandwidth annotations
	// (kubernetes.io/ingress-bandwidth, kubernetes.io/egress-bandwidth) as
	// "name=value" joined by ", ", or "": the bandwidth CNI plugin shapes
	// its veth, and the bypass must not skip that.
	Bandwidth string
}

// BandwidthAnnotations are the pod annotations the bandwidth CNI plugin
// shapes a pod's traffic by.
var BandwidthAnnotations = []string{"kubernetes.io/ingress-bandwidth", "kubernetes.io/egress-bandwidth"}

// Neighbours keeps a kernel-managed neighbour entry (NTF_EXT_MANAGED)
// on the bridge for each address of this node's pods that the API lists
// (Kubernetes mode with the bypass): the kernel resolves it and keeps it
// resolved, so the podnet watch learns every pod as an endpoint, also pods
// the node never talked to, and their entries are not garbage-collected.
//
// It owns the managed entries on the bridges of the pod ports the bypass
// is attached to: entries there whose address is not a local pod's are
// deleted. Nothing is done before the first list of pods from the API, so a
// restarted agent reconciles what an earlier one left.
type Neighbours struct {
	mu      sync.Mutex
	closed  bool
	bridges map[int]bool // bridges of the attached pod ports (last scan)
	pods    []PodAddrs   // nil until the API's first list
	errLog  map[netip.Addr]string
	count   int // managed entries of local pods' addresses, after the last reconcile
}

// NewNeighbours reconciles nothing before SetPods and SetBridges.
func NewNeighbours() *Neighbours {
	return &Neighbours{errLog: map[netip.Addr]string{}}
}

// SetBridges takes the bridges of a podnet scan and reconciles (every
// scan: routes, and entries deleted by hand, converge too; a converged
// reconcile writes nothing, so it raises no event).
func (n *Neighbours) SetBridges(bridges map[int]bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	n.bridges = bridges
	n.reconcile()
}

// SetPods takes the node's pods from the API (kube.Config.PodIPs) and reconciles.
func (n *Neighbours) SetPods(pods []PodAddrs) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	if pods == nil {
		pods = []PodAddrs{}
	}
	n.pods = pods
	n.reconcile()
}

// Close stops reconciling; the entries stay (uninstall removes them).
func (n *Neighbours) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
}

// Managed is the metric's count; ok is false before the first list of pods.
func (n *Neighbours) Managed() (count int, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.count, n.pods != nil
}

func (n *Neighbours) reconcile() {
	if n.pods == nil || len(n.bridges) == 0 {
		return
	}
	h, err := rtnl.Route()
	if err != nil {
		slog.Warn("bypass: managed neighbours: netlink", "err", err)
		return
	}
	defer h.Close()
	want := wantedNeighbours(n.pods, n.bridges, func(ip netip.Addr) (int, bool, error) {
		rs, err := h.RouteGet(ip.AsSlice())
		if err != nil || len(rs) == 0 {
			return 0, false, err
		}
		return rs[0].LinkIndex, rs[0].Gw == nil && rs[0].Via == nil, nil
	}, n.logOnce)
	have, err := Managed(h, n.bridges)
	if err != nil {
		slog.Warn("bypass: managed neighbours", "err", err)
		return
	}
	var added, removed []string
	count := 0
	for ip, br := range have {
		if want[ip] == br {
			count++
			continue
		}
		if err := DelNeigh(h, br, ip); err != nil {
			n.logOnce(ip, fmt.Errorf("delete managed neighbour on bridge %d: %w", br, err))
			continue
		}
		removed = append(removed, ip.String())
	}
	for ip, br := range want {
		if have[ip] == br {
			continue
		}
		if err := SetManaged(h, br, ip); err != nil {
			n.logOnce(ip, fmt.Errorf("add managed neighbour on bridge %d: %w", br, err))
			continue
		}
		delete(n.errLog, ip)
		count++
		added = append(added, ip.String())
	}
	for ip := range n.errLog {
		if _, ok := want[ip]; !ok {
			delete(n.errLog, ip) // a pod gone: a later failure is news again
		}
	}
	n.count = count
	if len(added)+len(removed) > 0 {
		slog.Info("bypass: managed neighbours of the node's pods", "added", added, "removed", removed, "managed", count)
	}
}

// logOnce logs err for ip unless the same error was logged last for it.
func (n *Neighbours) logOnce(ip netip.Addr, err error) {
	if n.errLog[ip] == err.Error() {
		return
	}
	n.errLog[ip] = err.Error()
	slog.Warn("bypass: managed neighbour of a pod", "addr", ip, "err", err)
}

// wantedNeighbours maps each pod address routed directly (no gateway) by
// one of bridges to that bridge. route gives an address's device.
func wantedNeighbours(pods []PodAddrs, bridges map[int]bool, route func(netip.Addr) (dev int, direct bool, err error), logErr func(netip.Addr, error)) map[netip.Addr]int {
	want := map[netip.Addr]int{}
	for _, p := range pods {
		for _, ip := range p.IPs {
			if !ip.IsGlobalUnicast() {
				continue
			}
			dev, direct, err := route(ip)
			if err != nil {
				logErr(ip, fmt.Errorf("route of pod %s/%s: %w", p.Namespace, p.Name, err))
				continue
			}
			if direct && bridges[dev] {
				want[ip] = dev
			}
		}
	}
	return want
}
