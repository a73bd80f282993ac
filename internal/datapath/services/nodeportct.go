package services

import (
	"log/slog"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// udpFlows matches the conntrack entries of UDP flows to a NodePort
// (original destination port) whose backend (reply source) is one of
// backends; nil backends: every backend.
type udpFlows struct {
	port     uint16
	backends []Backend
}

func (m udpFlows) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	if f.Forward.Protocol != unix.IPPROTO_UDP || f.Forward.DstPort != m.port {
		return false
	}
	if m.backends == nil {
		return true
	}
	src := netip.AddrPortFrom(addrOf(f.Reverse.SrcIP), f.Reverse.SrcPort)
	for _, b := range m.backends {
		if b == src {
			return true
		}
	}
	return false
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

// flushNodePortUDP deletes the conntrack entries of the UDP flows a
// NodePort sent to backends that left it (nil: to any backend, the
// NodePort is gone), as kube-proxy does (ClearEntriesForPortNAT,
// ClearEntriesForPort): the NodePort program leaves every flow conntrack
// knows alone, so a client that keeps sending would stay on a removed
// backend. Only f's family is looked at; the entries are those of the
// caller's network namespace, where the NodePort devices are. TCP flows
// keep their backend, as with kube-proxy. Errors are logged: the frontend
// is written already.
func flushNodePortUDP(f Frontend, backends []Backend) {
	fam := netlink.InetFamily(unix.AF_INET)
	if f.Addr.Is6() {
		fam = unix.AF_INET6
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, udpFlows{f.Port, backends})
	if err != nil {
		slog.Warn("services: UDP flows of a NodePort's removed backends not flushed", "nodeport", f.String(), "err", err)
	}
	if n > 0 {
		slog.Info("services: flushed the UDP flows of a NodePort's removed backends", "nodeport", f.String(), "flows", n)
	}
}
