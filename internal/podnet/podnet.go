// Package podnet is the agent's host network discovery, from netlink: the
// pods of a node's network namespace (their host-side veths, the veth ports
// of Linux bridges, and the addresses and MACs behind each veth), the
// uplinks to other nodes, the NodePort devices (nodeport.go), and the
// kernel-managed neighbour entries kept for the node's pods
// (neighbours.go). Nothing depends on interface names.
//
// The rule: a port is a veth whose master is a bridge and whose peer is in
// another network namespace (IFLA_LINK_NETNSID). An uplink is a device that
// a main-table route with a gateway (via, or onlink via) to a destination
// other than a default route leaves by, and that is neither a bridge, a
// bridge port nor loopback: the routes of host-gw and VXLAN CNIs to other
// nodes' pod CIDRs (a node's own pod CIDR is a connected route, without
// gateway). An endpoint is an IPv4 or
// IPv6 global unicast address with a usable neighbour entry on the bridge
// (REACHABLE, STALE, DELAY, PROBE or PERMANENT) whose MAC the bridge's FDB
// has learnt on exactly one port of that bridge. An address whose MAC is not
// in the FDB, is learnt on several ports, or appears on several bridges is
// left out.
package podnet

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/rtnl"
)

// Port is a pod's host-side veth.
type Port struct {
	Ifindex   int
	Name      string
	Bridge    int // the bridge's ifindex
	BridgeMAC net.HardwareAddr
	// NetNsID is the id the agent's namespace has for the pod's namespace
	// (the veth peer's IFLA_LINK_NETNSID): podnet.NetNsID of its nsfs path.
	NetNsID int
	// Control: another owner's qdisc, tc filter or tcx program on it that
	// the bypass would skip (Controls; filled in by Watch's scans only).
	Control Control
}

// Endpoint is an address of a pod: the port its MAC is learnt on.
type Endpoint struct {
	Port int // ifindex of the Port
	MAC  net.HardwareAddr
}

// Uplink is a device routes to other nodes leave by.
type Uplink struct {
	Ifindex int
	Name    string
	// Down: why the device cannot carry packets now (administratively
	// down, or no carrier), or "".
	Down string
	// Control: as Port's, receive side only.
	Control Control
}

// State is what one scan found.
type State struct {
	Ports     map[int]Port
	Uplinks   map[int]Uplink
	Endpoints map[netip.Addr]Endpoint
}

// neighbour states that name a MAC the node believes current.
const usable = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT

type fdbKey struct {
	bridge int
	mac    [6]byte
}

// Scan reads links, the bridges' FDBs and neighbour tables through h.
func Scan(h *netlink.Handle) (State, error) {
	st := State{Ports: map[int]Port{}, Uplinks: map[int]Uplink{}, Endpoints: map[netip.Addr]Endpoint{}}
	links, err := h.LinkList()
	if err != nil {
		return st, fmt.Errorf("podnet: list links: %w", err)
	}
	bridges := map[int]net.HardwareAddr{}
	for _, lk := range links {
		if _, ok := lk.(*netlink.Bridge); ok {
			bridges[lk.Attrs().Index] = lk.Attrs().HardwareAddr
		}
	}
	for _, lk := range links {
		a := lk.Attrs()
		mac, ok := bridges[a.MasterIndex]
		if _, veth := lk.(*netlink.Veth); !veth || !ok || a.NetNsID < 0 {
			continue
		}
		st.Ports[a.Index] = Port{Ifindex: a.Index, Name: a.Name, Bridge: a.MasterIndex, BridgeMAC: mac, NetNsID: a.NetNsID}
	}
	if err := scanUplinks(h, links, bridges, &st); err != nil {
		return st, err
	}
	if len(st.Ports) == 0 {
		return st, nil
	}
	fdb, err := h.NeighList(0, unix.AF_BRIDGE)
	if err != nil {
		return st, fmt.Errorf("podnet: list bridge FDB: %w", err)
	}
	learnt := map[fdbKey]int{} // -1: on several ports
	for _, e := range fdb {
		p, ok := st.Ports[e.LinkIndex]
		// PERMANENT entries are the port's own address, not a pod's.
		if !ok || e.MasterIndex != p.Bridge || e.State&netlink.NUD_PERMANENT != 0 || len(e.HardwareAddr) != 6 || e.HardwareAddr[0]&1 != 0 {
			continue
		}
		k := fdbKey{bridge: p.Bridge, mac: [6]byte(e.HardwareAddr)}
		if on, seen := learnt[k]; seen && on != p.Ifindex {
			learnt[k] = -1
		} else {
			learnt[k] = p.Ifindex
		}
	}
	seen := map[netip.Addr]int{} // bridge of each address; -1: several
	err = bridgeNeighbours(h, maps.Keys(bridges), func(br int, n netlink.Neigh) {
		if n.State&usable == 0 || len(n.HardwareAddr) != 6 {
			return
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if ip = ip.Unmap(); !ok || !ip.IsGlobalUnicast() {
			return
		}
		if b, dup := seen[ip]; dup && b != br {
			seen[ip] = -1
			delete(st.Endpoints, ip)
			return
		}
		seen[ip] = br
		port, ok := learnt[fdbKey{bridge: br, mac: [6]byte(n.HardwareAddr)}]
		if !ok || port < 0 {
			return
		}
		st.Endpoints[ip] = Endpoint{Port: port, MAC: n.HardwareAddr}
	})
	return st, err
}

// bridgeNeighbours calls fn for each IPv4 and IPv6 neighbour entry of each
// of bridges.
func bridgeNeighbours(h *netlink.Handle, bridges iter.Seq[int], fn func(bridge int, n netlink.Neigh)) error {
	for br := range bridges {
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			ns, err := h.NeighList(br, fam)
			if err != nil {
				return fmt.Errorf("podnet: list neighbours of bridge %d: %w", br, err)
			}
			for _, n := range ns {
				if n.LinkIndex == br {
					fn(br, n)
				}
			}
		}
	}
	return nil
}

// linkDown says why a device cannot carry packets now, or "". Devices
// without carrier reporting (a VXLAN device's oper state is UNKNOWN) count
// as up while administratively up.
func linkDown(a *netlink.LinkAttrs) string {
	switch {
	case a.Flags&net.FlagUp == 0:
		return "administratively down"
	case a.OperState == netlink.OperDown, a.OperState == netlink.OperLowerLayerDown, a.OperState == netlink.OperNotPresent:
		return "no carrier (oper state " + a.OperState.String() + ")"
	}
	return ""
}

// scanUplinks adds the uplinks: devices of gateway routes of the main table
// to non-default destinations, bridges, bridge ports and loopback left out.
func scanUplinks(h *netlink.Handle, links []netlink.Link, bridges map[int]net.HardwareAddr, st *State) error {
	byIndex := map[int]netlink.Link{}
	for _, lk := range links {
		byIndex[lk.Attrs().Index] = lk
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		rs, err := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return fmt.Errorf("podnet: list routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst == nil || r.Type != unix.RTN_UNICAST {
				continue
			}
			if ones, _ := r.Dst.Mask.Size(); ones == 0 {
				continue // a default route: not to a node's pods
			}
			hops := []*netlink.NexthopInfo{{LinkIndex: r.LinkIndex, Gw: r.Gw, Via: r.Via}}
			if len(r.MultiPath) > 0 {
				hops = r.MultiPath
			}
			for _, nh := range hops {
				lk, ok := byIndex[nh.LinkIndex]
				if !ok || (nh.Gw == nil && nh.Via == nil) {
					continue
				}
				a := lk.Attrs()
				if _, isBridge := bridges[a.Index]; isBridge || a.Flags&net.FlagLoopback != 0 {
					continue
				}
				if _, inBridge := bridges[a.MasterIndex]; inBridge {
					continue
				}
				st.Uplinks[a.Index] = Uplink{Ifindex: a.Index, Name: a.Name, Down: linkDown(a)}
			}
		}
	}
	return nil
}

// coalesce is how long Watch gathers netlink events before it scans.
const coalesce = 100 * time.Millisecond

// Watch subscribes to link, neighbour (and FDB), route, qdisc and tc filter
// updates, scans (with each device's Controls), and
// then, on a goroutine of its own until ctx is done, scans again after
// updates (gathered for 100 ms) and every resync as a backstop. sync gets
// every successful scan, never concurrently. The first scan's error is
// returned; later ones are logged.
func Watch(ctx context.Context, resync time.Duration, sync func(State)) error {
	w := &watcher{}
	w.subscribe()
	st, err := scan()
	if err != nil {
		close(w.done)
		return err
	}
	sync(st)
	go w.run(ctx, resync, sync)
	return nil
}

func scan() (State, error) {
	h, err := rtnl.Route()
	if err != nil {
		return State{}, fmt.Errorf("podnet: netlink: %w", err)
	}
	defer h.Close()
	st, err := Scan(h)
	if err != nil {
		return st, err
	}
	addControls(h, &st)
	return st, nil
}

type watcher struct {
	links  chan netlink.LinkUpdate
	neighs chan netlink.NeighUpdate
	routes chan netlink.RouteUpdate
	tc     chan struct{} // qdisc and tc filter changes (RTNLGRP_TC); tcx links raise no event
	done   chan struct{}
}

// subscribe (re)subscribes; a nil channel is a failed subscription.
func (w *watcher) subscribe() {
	if w.done != nil {
		close(w.done)
	}
	w.done = make(chan struct{})
	w.links, w.neighs, w.routes = make(chan netlink.LinkUpdate, 256), make(chan netlink.NeighUpdate, 256), make(chan netlink.RouteUpdate, 256)
	done := w.done
	logErr := func(err error) {
		select {
		case <-done: // closing the subscription fails its receive: not news
		default:
			slog.Warn("podnet: netlink subscription", "err", err)
		}
	}
	if err := netlink.LinkSubscribeWithOptions(w.links, w.done, netlink.LinkSubscribeOptions{ErrorCallback: logErr}); err != nil {
		slog.Warn("podnet: subscribe to link updates (resyncing periodically)", "err", err)
		w.links = nil
	}
	if err := netlink.NeighSubscribeWithOptions(w.neighs, w.done, netlink.NeighSubscribeOptions{ErrorCallback: logErr}); err != nil {
		slog.Warn("podnet: subscribe to neighbour updates (resyncing periodically)", "err", err)
		w.neighs = nil
	}
	if err := netlink.RouteSubscribeWithOptions(w.routes, w.done, netlink.RouteSubscribeOptions{ErrorCallback: logErr}); err != nil {
		slog.Warn("podnet: subscribe to route updates (resyncing periodically)", "err", err)
		w.routes = nil
	}
	w.tc = make(chan struct{}, 1)
	if err := subscribeTC(w.tc, w.done); err != nil {
		slog.Warn("podnet: subscribe to qdisc and tc filter updates (resyncing periodically)", "err", err)
		w.tc = nil
	}
}

// subscribeTC signals ch (without blocking) on every qdisc or tc filter
// change of the calling thread's network namespace until done is closed;
// ch is closed when the subscription ends.
func subscribeTC(ch chan struct{}, done <-chan struct{}) error {
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_TC)
	if err != nil {
		return err
	}
	go func() {
		<-done
		s.Close()
	}()
	go func() {
		defer close(ch)
		for {
			msgs, _, err := s.Receive()
			if err != nil {
				return
			}
			if len(msgs) > 0 {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return nil
}

func (w *watcher) run(ctx context.Context, resync time.Duration, sync func(State)) {
	defer func() { close(w.done) }()
	tick := time.NewTicker(resync)
	defer tick.Stop()
	var soon <-chan time.Time
	event := func() {
		if soon == nil {
			soon = time.After(coalesce)
		}
	}
	rescan := func() {
		st, err := scan()
		if err != nil {
			slog.Warn("podnet: scan", "err", err)
			return
		}
		sync(st)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-w.links:
			if !ok {
				w.links = nil
			}
			event()
		case _, ok := <-w.neighs:
			if !ok {
				w.neighs = nil
			}
			event()
		case _, ok := <-w.routes:
			if !ok {
				w.routes = nil
			}
			event()
		case _, ok := <-w.tc:
			if !ok {
				w.tc = nil
			}
			event()
		case <-soon:
			soon = nil
			rescan()
		case <-tick.C:
			if w.links == nil || w.neighs == nil || w.routes == nil || w.tc == nil {
				w.subscribe() // a subscription ended (for example ENOBUFS)
			}
			rescan()
		}
	}
}
