package bypass

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/podnet"
)

// Node is the agent's side of the bridge bypass, in its network namespace: it
// converges the attached pod veths, uplinks and endpoints to what podnet
// discovers. Its maps and links are pinned with the datapath: a restart
// adopts them (links updated in place, endpoints converged from the pinned
// map), and closing releases this process's handles only.
type Node struct {
	mu      sync.Mutex
	bp      *Bypass // nil once closed
	applied map[netip.Addr]Endpoint
	noXnode string             // why uplinks are not attached now ("": they are)
	neigh   *podnet.Neighbours // Kubernetes mode: managed neighbours of the node's pods; else nil
	// standby: why nothing is attached now because the bypass could not
	// act ("": it can); probed again at standbyNext (conntrackBlocker).
	standby     string
	standbyKind string // standbyKind*: the reason label of eztunnel_bypass_standby
	standbyNext time.Time
	// idle: devices not attached because the bypass could not act there,
	// or must not (name: why); idleKinds: the same devices' reason kinds
	// (idleKind*, podnet.Control*).
	idle, idleKinds map[string]string
	// shaped: the addresses of pods with a bandwidth annotation
	// (Kubernetes mode; address: why), from setPods.
	shaped map[netip.Addr]string
	// waiting: the pod veths among them waiting for their pod's address
	// (ifindexes), whose bridges need the managed neighbours (syncNeighbours).
	waiting map[int]bool
	// onReport is told each change of standby or idle (the parts report); may be nil.
	onReport func(standby string, idle map[string]string)
}

// How often the bypass looks again whether conntrack runs in its network
// namespace: while it does not (conntrack may come with kube-proxy's or
// the CNI's first rule), and while it does.
const (
	conntrackProbeOff = 5 * time.Second // the agent's backstop resync of the pods' devices
	conntrackProbeOn  = time.Minute
)

// conntrackBlocker says why the bypass cannot act in the agent's network
// namespace now, or "" (b.mu held). The bypass acts only on flows conntrack
// confirmed: where conntrack does not run, every packet would fall back
// after paying for the lookup, so nothing is attached
// (docs/families/bypass-design.md, "Attached only where it can act").
func (b *Node) conntrackBlocker() string {
	now := time.Now()
	if now.Before(b.standbyNext) {
		return b.standby
	}
	why, kind := "", ""
	if active, err := ConntrackActive(); err != nil {
		why, kind = err.Error(), standbyKindConntrackUnreadable
	} else if !active {
		why, kind = "conntrack does not run in the node's network namespace (no rule uses it): every packet would fall back to the kernel path", standbyKindConntrackInactive
	}
	next := conntrackProbeOff
	if why == "" {
		next = conntrackProbeOn
	}
	b.standbyNext = now.Add(next)
	if why != b.standby {
		if why != "" {
			slog.Warn("bypass: standing by, attached nowhere", "reason", why)
		} else {
			slog.Info("bypass: conntrack runs: attaching")
		}
		b.standby, b.standbyKind = why, kind
		b.report()
	}
	return why
}

// report tells onReport the standby and the idle devices (b.mu held).
func (b *Node) report() {
	if b.onReport != nil {
		b.onReport(b.standby, b.idle)
	}
}

// setIdle records the devices left unattached because the bypass could
// not act there, logging each change (b.mu held).
func (b *Node) setIdle(idle, kinds map[string]string) {
	b.idleKinds = kinds
	if maps.Equal(idle, b.idle) {
		return
	}
	for dev, why := range idle {
		if b.idle[dev] != why {
			slog.Info("bypass: not attaching here: it could not act", "device", dev, "reason", why)
		}
	}
	b.idle = idle
	b.report()
}

// Why the bypass does not attach to a device it could otherwise take, and
// the reason kinds (the reason label of eztunnel_bypass_idle_devices; the
// podnet.Control kinds too).
const (
	idleNoEndpoint = "no pod address learnt on it yet (bridge FDB and neighbour table): nothing could be delivered to it"
	idleUplinkDown = "uplink down: "

	idleKindNoEndpoint = "no_endpoint"
	idleKindUplinkDown = "uplink_down"
	idleKindBandwidth  = "bandwidth_annotation"
)

// controlled is why a device must stay on the kernel path, with its kind: a
// traffic control of another owner on it (podnet.Controls) that a redirect
// would skip, or a pod behind it that the bandwidth CNI plugin shapes (its
// annotations, Kubernetes mode). Both directions stay on the kernel path:
// neither program is attached to the device and no endpoint is written
// for its pod (docs/families/bypass-design.md, "Traffic controls").
func (b *Node) controlled(c podnet.Control, ifx int, eps map[netip.Addr]Endpoint) (why, kind string) {
	if c.Kind != "" {
		return c.String() + ": the bypass would skip it", c.Kind
	}
	var ips []netip.Addr
	for ip, ep := range eps {
		if ep.Ifindex == ifx && b.shaped[ip] != "" {
			ips = append(ips, ip)
		}
	}
	if len(ips) == 0 {
		return "", ""
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	return idleKindBandwidth + ": " + b.shaped[ips[0]] + ": the bandwidth CNI plugin shapes its veth, which the bypass would skip", idleKindBandwidth
}

// ManageNeighbours makes the node keep managed neighbour entries on the pod
// bridges for the node's pods (Kubernetes mode), so that every pod is an
// endpoint (podnet/neighbours.go); SetPods feeds them. Call it before the
// first SetPods.
func (b *Node) ManageNeighbours() { b.neigh = podnet.NewNeighbours() }

// SetReporter tells f each change of the standby and of the idle devices
// (the parts report).
func (b *Node) SetReporter(f func(standby string, idle map[string]string)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onReport = f
}

// SetPods records the node's pods from the API (Kubernetes mode): those
// with a bandwidth annotation stay on the kernel path from the next
// convergence on; the managed neighbours follow them (after: the
// neighbours they make lead to the attachments).
func (b *Node) SetPods(pods []podnet.PodAddrs) {
	shaped := map[netip.Addr]string{}
	for _, p := range pods {
		if p.Bandwidth == "" {
			continue
		}
		for _, ip := range p.IPs {
			shaped[ip] = fmt.Sprintf("pod %s/%s has %s", p.Namespace, p.Name, p.Bandwidth)
		}
	}
	b.mu.Lock()
	b.shaped = shaped
	b.mu.Unlock()
	if b.neigh != nil {
		b.neigh.SetPods(pods)
	}
}

// xnodeBlocker says why the bypass must not run between nodes here, or "".
// IPsec: the kernel path checks the node's xfrm policies (a forwarded
// packet must have come through an SA) and encrypts on output; the bypass
// does neither, so with any xfrm policy in the netns it stays same-node.
func xnodeBlocker() string {
	ps, err := netlink.XfrmPolicyList(netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Sprintf("cannot list xfrm (IPsec) policies: %v", err)
	}
	if len(ps) > 0 {
		return fmt.Sprintf("%d xfrm (IPsec) policies in the node's network namespace: the bypass would skip their checks", len(ps))
	}
	return ""
}

// NewNode runs the agent's side of the bypass the datapath loaded:
// it converges from the endpoints pinned (an earlier agent's, or none).
func NewNode(bp *Bypass) (*Node, error) {
	applied, err := bp.Endpoints()
	if err != nil {
		return nil, fmt.Errorf("--bypass: %w", err)
	}
	if len(applied) > 0 {
		slog.Info("bridge bypass: adopting the endpoints an earlier agent pinned", "endpoints", len(applied))
	}
	return &Node{bp: bp, applied: applied}, nil
}

// Prune unpins what an earlier agent attached that the first convergence
// did not want (devices gone or no longer pods' or uplinks).
func (b *Node) Prune() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bp == nil {
		return
	}
	pruned, err := b.bp.Prune()
	if err != nil {
		slog.Warn("bypass: prune links of an earlier agent", "err", err)
	}
	if len(pruned) > 0 {
		slog.Info("bypass: detached links of an earlier agent no longer wanted", "links", pruned)
	}
}

// LogAttached reports what the first convergence (watchPods) attached.
func (b *Node) LogAttached() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bp == nil {
		return
	}
	slog.Info("bridge bypass attached (pinned: it stays while the agent restarts)", "devices", len(b.bp.Attached()), "uplinks", len(b.bp.Uplinks()), "endpoints", len(b.applied))
}

// Apply converges to st: endpoints of gone ports out first, then gone
// ports detached, new ports attached, endpoints written.
func (b *Node) Apply(st podnet.State) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bp == nil {
		return
	}
	if b.conntrackBlocker() != "" {
		st = podnet.State{} // nothing to attach: every device detached, every endpoint removed
	}
	idle, kinds, waiting := map[string]string{}, map[string]string{}, map[int]bool{}
	want := map[netip.Addr]Endpoint{}
	for ip, e := range st.Endpoints {
		p := st.Ports[e.Port]
		want[ip] = Endpoint{Ifindex: p.Ifindex, PodMAC: e.MAC, BridgeMAC: p.BridgeMAC}
	}
	// Ports another owner's traffic control (or a pod's bandwidth
	// annotation) keeps on the kernel path: their endpoints go first, then
	// the ports, also attached ones.
	blocked := map[int]bool{}
	for ifx, p := range st.Ports {
		if why, kind := b.controlled(p.Control, ifx, want); why != "" {
			blocked[ifx], idle[p.Name], kinds[p.Name] = true, why, kind
		}
	}
	for ip, ep := range want {
		if blocked[ep.Ifindex] {
			delete(want, ip)
		}
	}
	var removed, added []string
	for ip := range b.applied {
		if _, ok := want[ip]; ok {
			continue
		}
		if err := b.bp.DeleteEndpoint(ip); err != nil {
			slog.Warn("bypass: delete endpoint", "addr", ip, "err", err)
		}
		delete(b.applied, ip)
		removed = append(removed, ip.String())
	}
	var detached, attached []string
	uplinks := b.crossNodeUplinks(st)
	for _, ifx := range b.bp.Uplinks() {
		if u, ok := uplinks[ifx]; ok && u.Control.Kind == "" {
			continue
		}
		if err := b.bp.Detach(ifx); err != nil {
			slog.Warn("bypass: detach uplink", "ifindex", ifx, "err", err)
		}
		detached = append(detached, fmt.Sprint(ifx))
	}
	for _, ifx := range b.bp.Attached() {
		if _, ok := st.Ports[ifx]; ok && !blocked[ifx] {
			continue
		}
		if err := b.bp.Detach(ifx); err != nil {
			slog.Warn("bypass: detach", "ifindex", ifx, "err", err)
		}
		detached = append(detached, fmt.Sprint(ifx))
	}
	on := map[int]bool{}
	for _, ifx := range b.bp.Attached() {
		on[ifx] = true
	}
	hasEndpoint := map[int]bool{}
	for _, ep := range want {
		hasEndpoint[ep.Ifindex] = true
	}
	for ifx, p := range st.Ports {
		if blocked[ifx] {
			continue
		}
		if on[ifx] {
			// The bridge's MAC may have changed (a new port).
			if err := b.bp.SetBridge(ifx, p.Bridge, p.BridgeMAC); err != nil {
				slog.Warn("bypass: pod veth's bridge", "device", p.Name, "err", err)
			}
			continue
		}
		// A pod veth is attached once its pod's address is learnt: before,
		// its programs would only pay for lookups that fall back. Attached
		// ports stay while they exist (no flapping with neighbour entries).
		if !hasEndpoint[ifx] {
			idle[p.Name], kinds[p.Name], waiting[ifx] = idleNoEndpoint, idleKindNoEndpoint, true
			continue
		}
		// One at a time: a veth that disappeared meanwhile fails alone.
		if err := b.bp.Attach(ifx); err != nil {
			slog.Warn("bypass: attach", "device", p.Name, "ifindex", ifx, "err", err)
			continue
		}
		on[ifx] = true
		attached = append(attached, p.Name)
	}
	attached = append(attached, b.attachUplinks(uplinks, idle, kinds)...)
	added = b.setEndpoints(want, on)
	b.setIdle(idle, kinds)
	b.waiting = waiting
	if len(removed)+len(added)+len(attached)+len(detached) > 0 {
		slog.Info("bypass converged", "attached", attached, "detached_ifindexes", detached,
			"endpoints_set", added, "endpoints_removed", removed)
	}
}

// attachUplinks attaches to the uplinks not attached yet, and records in
// idle and kinds why one stays idle; it returns the names attached (b.mu held).
func (b *Node) attachUplinks(uplinks map[int]podnet.Uplink, idle, kinds map[string]string) (attached []string) {
	up := map[int]bool{}
	for _, ifx := range b.bp.Uplinks() {
		up[ifx] = true
	}
	for ifx, u := range uplinks {
		if up[ifx] {
			continue
		}
		if u.Control.Kind != "" {
			idle[u.Name], kinds[u.Name] = u.Control.String()+": the bypass would skip it", u.Control.Kind
			continue
		}
		if u.Down != "" {
			idle[u.Name], kinds[u.Name] = idleUplinkDown+u.Down, idleKindUplinkDown
			continue
		}
		if err := b.bp.AttachUplinks(ifx); err != nil {
			slog.Warn("bypass: attach uplink", "device", u.Name, "ifindex", ifx, "err", err)
			continue
		}
		attached = append(attached, u.Name)
	}
	return attached
}

// setEndpoints writes each wanted endpoint whose pod veth is attached (on)
// and that changed; it returns the addresses written (b.mu held).
func (b *Node) setEndpoints(want map[netip.Addr]Endpoint, on map[int]bool) (added []string) {
	for ip, ep := range want {
		if !on[ep.Ifindex] {
			continue // its admission program is not attached: no bypass to it
		}
		if old, ok := b.applied[ip]; ok && old.Ifindex == ep.Ifindex && bytes.Equal(old.PodMAC, ep.PodMAC) && bytes.Equal(old.BridgeMAC, ep.BridgeMAC) {
			continue
		}
		if err := b.bp.SetEndpoint(ip, ep); err != nil {
			slog.Warn("bypass: endpoint", "addr", ip, "err", err)
			continue
		}
		b.applied[ip] = ep
		added = append(added, ip.String())
	}
	return added
}

// crossNodeUplinks returns st's uplinks, or none while the bypass must not
// run between nodes (xnodeBlocker), logging each change (b.mu held).
func (b *Node) crossNodeUplinks(st podnet.State) map[int]podnet.Uplink {
	why := xnodeBlocker()
	switch {
	case why != "" && why != b.noXnode:
		slog.Warn("bypass: not between nodes (same node only)", "reason", why)
	case why == "" && b.noXnode != "":
		slog.Info("bypass: between nodes again")
	}
	b.noXnode = why
	if why != "" {
		return nil
	}
	return st.Uplinks
}

// SyncNeighbours gives the managed neighbours (Kubernetes mode) the
// bridges of st's ports the bypass is attached to, or waits to attach to
// until a pod address is known on them: the managed neighbours are what
// makes those addresses known (the API's pods), so they must not wait for
// the attachment.
func (b *Node) SyncNeighbours(st podnet.State) {
	if b.neigh == nil {
		return
	}
	b.mu.Lock()
	if b.bp == nil {
		b.mu.Unlock()
		return
	}
	bridges := map[int]bool{}
	for _, ifx := range b.bp.Attached() {
		if p, ok := st.Ports[ifx]; ok {
			bridges[p.Bridge] = true
		}
	}
	for ifx := range b.waiting {
		if p, ok := st.Ports[ifx]; ok {
			bridges[p.Bridge] = true
		}
	}
	b.mu.Unlock()
	b.neigh.SetBridges(bridges)
}

// BypassManagedNeighbours implements metrics.ManagedNeighbourSource: ok is
// false without Kubernetes mode or before the API's first list of pods.
func (b *Node) BypassManagedNeighbours() (n int, ok bool) {
	if b.neigh == nil {
		return 0, false
	}
	return b.neigh.Managed()
}

// Close stops converging the bypass (it stays pinned and attached; the
// datapath releases its handles); safe to call twice. A later apply (the
// pods' watch) does nothing.
func (b *Node) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bp == nil {
		return
	}
	if b.neigh != nil {
		b.neigh.Close()
	}
	b.bp = nil
}

var errBypassClosed = errors.New("bypass: closed")

// BypassCounters implements metrics.BypassSource.
func (b *Node) BypassCounters() (map[string]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bp == nil {
		return nil, errBypassClosed
	}
	return b.bp.Counters()
}

// BypassIdleKinds implements metrics.BypassSource.
func (b *Node) BypassIdleKinds() map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.idleKinds)
}

// BypassStandbyKind implements metrics.BypassSource.
func (b *Node) BypassStandbyKind() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.standbyKind
}

// BypassState implements metrics.BypassSource.
func (b *Node) BypassState() (devices, endpoints int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bp == nil {
		return 0, 0
	}
	return len(b.bp.Attached()) + len(b.bp.Uplinks()), len(b.applied)
}

// RemoveManagedNeighbours deletes the managed neighbour entries on the pod
// bridges (the bypass's, see podNeighbours): on uninstall (the agent's and
// `eztunnel uninstall`) and when the bypass is off.
func RemoveManagedNeighbours() {
	n, err := podnet.RemoveManaged()
	if err != nil {
		slog.Warn("bypass: remove managed neighbours of the pods", "removed", n, "err", err)
	} else if n > 0 {
		slog.Info("bypass: removed the managed neighbours of the pods", "entries", n)
	}
}
