package multinode

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Wire is a veth pair straight between two pods of a node: no bridge, no
// node namespace. With its routes on, each pod reaches the other's
// addresses over it. That is the shortest path two network namespaces
// joined by veths can have (one netif_rx per direction), and so the floor
// of any datapath between pods on veths: the bypass's redirect_peer path
// has the same single netif_rx, plus its tc programs.
type Wire struct {
	a, b *Pod
}

// wireDev is the wire's device name in both pods.
const wireDev = "wire0"

// AddWire joins p and q with a wire, its routes off. The pods' namespaces
// take it with them when the lab closes.
func (p *Pod) AddWire(q *Pod) (*Wire, error) {
	if p.Node != q.Node || p == q {
		return nil, fmt.Errorf("multinode: wire %s-%s: two pods of one node", p.Name, q.Name)
	}
	ha, err := p.Handle()
	if err != nil {
		return nil, err
	}
	defer ha.Close()
	hb, err := q.Handle()
	if err != nil {
		return nil, err
	}
	defer hb.Close()
	qns, err := nsFd(q.NetNS)
	if err != nil {
		return nil, err
	}
	defer qns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: wireDev, MTU: p.Node.lab.PodMTU},
		PeerName:      wireDev,
		PeerNamespace: netlink.NsFd(int(qns)),
	}
	if err := ha.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("multinode: wire %s-%s: %w", p.Name, q.Name, err)
	}
	la, err := ha.LinkByName(wireDev)
	if err != nil {
		return nil, err
	}
	lb, err := hb.LinkByName(wireDev)
	if err != nil {
		return nil, err
	}
	if err := hb.LinkSetMTU(lb, p.Node.lab.PodMTU); err != nil {
		return nil, err
	}
	// Permanent neighbours: IPv6 neighbour discovery answers only for
	// addresses of the device asked on, and the pods' are on eth0.
	for _, end := range []struct {
		h      *netlink.Handle
		link   netlink.Link
		peer   *Pod
		peerHW net.HardwareAddr
	}{{ha, la, q, lb.Attrs().HardwareAddr}, {hb, lb, p, la.Attrs().HardwareAddr}} {
		for _, addr := range []netip.Addr{end.peer.IPv4, end.peer.IPv6} {
			n := &netlink.Neigh{LinkIndex: end.link.Attrs().Index, State: netlink.NUD_PERMANENT,
				IP: addr.AsSlice(), HardwareAddr: end.peerHW, Family: addrFamily(addr)}
			if err := end.h.NeighSet(n); err != nil {
				return nil, fmt.Errorf("multinode: wire neighbour %s: %w", addr, err)
			}
		}
		if err := end.h.LinkSetUp(end.link); err != nil {
			return nil, err
		}
	}
	return &Wire{a: p, b: q}, nil
}

func addrFamily(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// Route turns the wire's routes on (each pod's addresses reach the other
// over the wire, host routes that win over eth0's) or off (the pods talk
// through the node again).
func (w *Wire) Route(on bool) error {
	for _, end := range [][2]*Pod{{w.a, w.b}, {w.b, w.a}} {
		if err := end[0].wireRoutes(end[1], on); err != nil {
			return fmt.Errorf("multinode: wire routes in %s: %w", end[0].Name, err)
		}
	}
	return nil
}

func (p *Pod) wireRoutes(peer *Pod, on bool) error {
	h, err := p.Handle()
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.LinkByName(wireDev)
	if err != nil {
		return err
	}
	for _, a := range []netip.Addr{peer.IPv4, peer.IPv6} {
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK,
			Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}}
		if on {
			err = h.RouteReplace(r)
		} else if err = h.RouteDel(r); errors.Is(err, unix.ESRCH) {
			err = nil // off already
		}
		if err != nil {
			return fmt.Errorf("route %s: %w", a, err)
		}
	}
	return nil
}
