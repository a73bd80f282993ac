package podnet

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/rtnl"
)

// Bridges are the bridges of st's pod ports (their ifindexes).
func (st State) Bridges() map[int]bool {
	out := map[int]bool{}
	for _, p := range st.Ports {
		out[p.Bridge] = true
	}
	return out
}

// Managed lists the kernel-managed neighbour entries (NTF_EXT_MANAGED) on
// bridges: address -> bridge ifindex.
func Managed(h *netlink.Handle, bridges map[int]bool) (map[netip.Addr]int, error) {
	out := map[netip.Addr]int{}
	err := bridgeNeighbours(h, maps.Keys(bridges), func(br int, n netlink.Neigh) {
		if n.FlagsExt&netlink.NTF_EXT_MANAGED == 0 {
			return
		}
		if ip, ok := netip.AddrFromSlice(n.IP); ok {
			out[ip.Unmap()] = br
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// SetManaged adds (or marks) a kernel-managed neighbour entry for ip on
// bridge: the kernel resolves it and keeps it resolved (Linux >= 5.16).
// An entry that exists keeps its state and MAC.
func SetManaged(h *netlink.Handle, bridge int, ip netip.Addr) error {
	return h.NeighSet(&netlink.Neigh{LinkIndex: bridge, Family: family(ip), IP: ip.AsSlice(),
		State: netlink.NUD_NONE, FlagsExt: netlink.NTF_EXT_MANAGED})
}

// DelNeigh deletes the neighbour entry of ip on bridge; a missing one is no error.
func DelNeigh(h *netlink.Handle, bridge int, ip netip.Addr) error {
	err := h.NeighDel(&netlink.Neigh{LinkIndex: bridge, Family: family(ip), IP: ip.AsSlice()})
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

func family(ip netip.Addr) int {
	if ip.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// RemoveManaged deletes every kernel-managed neighbour entry on the bridges
// of this network namespace's pod ports: those the agent keeps for the
// bypass (Kubernetes mode). It returns how many it deleted.
func RemoveManaged() (int, error) {
	h, err := rtnl.Route()
	if err != nil {
		return 0, fmt.Errorf("podnet: netlink: %w", err)
	}
	defer h.Close()
	st, err := Scan(h)
	if err != nil {
		return 0, err
	}
	m, err := Managed(h, st.Bridges())
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for ip, br := range m {
		if err := DelNeigh(h, br, ip); err != nil {
			errs = append(errs, fmt.Errorf("podnet: delete neighbour %s on bridge %d: %w", ip, br, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
