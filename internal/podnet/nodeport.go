package podnet

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
)

// NodePortDevices lists the devices NodePorts answer on (names given, or
// every device with a global unicast address that is neither loopback nor
// a bridge port) and their global unicast addresses.
func NodePortDevices(names []string) (ifindexes []int, addrs []netip.Addr, err error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("list links: %w", err)
	}
	byIndex := map[int]netlink.Link{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}
	for _, n := range names {
		if _, err := netlink.LinkByName(n); err != nil {
			return nil, nil, fmt.Errorf("NodePort device %q: %w", n, err)
		}
	}
	for _, l := range links {
		a := l.Attrs()
		if len(names) > 0 {
			if !slices.Contains(names, a.Name) {
				continue
			}
		} else {
			if a.Flags&net.FlagLoopback != 0 {
				continue
			}
			if m, ok := byIndex[a.MasterIndex]; ok {
				if _, br := m.(*netlink.Bridge); br {
					continue // a pod's veth, or an uplink enslaved to a bridge
				}
			}
		}
		as, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, nil, fmt.Errorf("addresses of %s: %w", a.Name, err)
		}
		var found bool
		for _, ad := range as {
			ip, ok := netip.AddrFromSlice(ad.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if !ip.IsGlobalUnicast() {
				continue
			}
			addrs = append(addrs, ip)
			found = true
		}
		if found || len(names) > 0 {
			ifindexes = append(ifindexes, a.Index)
		}
	}
	return ifindexes, addrs, nil
}
