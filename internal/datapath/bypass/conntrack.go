package bypass

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ConntrackActive reports whether conntrack tracks the flows of the
// caller's network namespace. The bypass acts only on flows conntrack
// confirmed (its admission rule); conntrack's hooks are registered in a
// namespace by the first rule that needs them (iptables -m conntrack or
// nat, nft ct, kube-proxy), and where there is none every packet would
// fall back (fallback_no_conntrack) after paying for the lookup.
//
// The probe sends one UDP datagram from 127.0.0.1 to itself (conntrack,
// where it runs, confirms the new flow before sendto returns) and looks at
// net.netfilter.nf_conntrack_count: a rise means conntrack runs. Where it
// does not rise (entries expiring meanwhile could hide the new one), the
// table is searched for the datagram's flow, which is deleted. (Quirk, 6.18:
// the "insert" statistic of /proc/net/stat/nf_conntrack stays 0 on a
// normal confirm, so it cannot tell.) A NOTRACK rule on lo would make the
// probe say no.
func ConntrackActive() (bool, error) {
	before, err := conntrackCount()
	if err != nil {
		return false, err
	}
	port, err := loopbackDatagram()
	if err != nil {
		return false, fmt.Errorf("bypass: conntrack probe: %w", err)
	}
	after, err := conntrackCount()
	if err != nil {
		return false, err
	}
	if after > before {
		return true, nil
	}
	if before == 0 && after == 0 {
		return false, nil
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, probeFlow(port))
	if err != nil {
		return false, fmt.Errorf("bypass: conntrack probe: %w", err)
	}
	return n > 0, nil
}

// probeFlow matches the probe's flow: UDP 127.0.0.1:port to itself.
type probeFlow uint16

func (p probeFlow) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	lo := net.IPv4(127, 0, 0, 1)
	return f.Forward.Protocol == unix.IPPROTO_UDP && f.Forward.SrcPort == uint16(p) && f.Forward.DstPort == uint16(p) &&
		f.Forward.SrcIP.Equal(lo) && f.Forward.DstIP.Equal(lo)
}

// conntrackCount is net.netfilter.nf_conntrack_count of the caller's
// network namespace (the thread's: /proc/sys/net follows it).
func conntrackCount() (uint64, error) {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
	if err != nil {
		return 0, fmt.Errorf("bypass: conntrack count (nf_conntrack loaded?): %w", err)
	}
	return strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
}

// loopbackDatagram sends one UDP datagram from 127.0.0.1 to itself and
// returns its port.
func loopbackDatagram() (uint16, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return 0, err
	}
	self, err := unix.Getsockname(fd)
	if err != nil {
		return 0, err
	}
	sa, ok := self.(*unix.SockaddrInet4)
	if !ok {
		return 0, fmt.Errorf("loopback socket bound to %v", self)
	}
	return uint16(sa.Port), unix.Sendto(fd, []byte("eztunnel conntrack probe"), 0, self)
}
