// Package multinode builds a cluster of lab nodes from network namespaces,
// for tests and benchmarks of cross-node traffic. Nothing is made in the
// host network namespace:
//
//   - the underlay: a namespace holding one Linux bridge (the "switch");
//   - each node: a namespace with its pod bridge (address .1 of its pod
//     CIDR), an uplink veth to the underlay bridge, IPv4 and IPv6
//     forwarding, and an iptables firewall (firewall.go);
//   - each pod: a namespace with eth0, a veth to its node's bridge, and a
//     cgroup v2 of its own under the node's managed (or unmanaged) subtree;
//   - the external host: a namespace on the underlay outside every pod
//     CIDR, with no route to the pods (traffic to it is masqueraded).
//
// Routing between nodes is host-gw (a route per remote pod CIDR via that
// node's underlay address) or a Flannel-style VXLAN overlay (one VXLAN
// device per node, static FDB and neighbour entries per remote node, routes
// to remote pod CIDRs via the device with onlink next hops). Pods have IPv4
// and IPv6 in both modes; the VXLAN underlay (the tunnel's outer header) is
// IPv4 only.
//
// Names follow lab/netlab (Prefix, the lab's name, owner records), so a
// lab of a killed process is removed by netlab.Sweep or by the next New of
// the same name.
package multinode

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// Prefix starts every namespace, link and cgroup name (netlab's).
const Prefix = netlab.Prefix

// Mode is how nodes reach each other's pod CIDRs.
type Mode string

const (
	// HostGW: a route per remote pod CIDR via the remote node's underlay
	// address, on the uplink.
	HostGW Mode = "host-gw"
	// VXLAN: Flannel-style overlay over the IPv4 underlay.
	VXLAN Mode = "vxlan"
)

// VXLANPort is the overlay's UDP port (Flannel's, the Linux default).
const VXLANPort = 8472

// vxlanOverhead is what VXLAN over IPv4 adds: outer IPv4, UDP, VXLAN, inner
// Ethernet.
const vxlanOverhead = 50

// Addressing. Pods of node i: 10.88.i.0/24 and fd88:0:i::/64, the node's
// bridge .1 / ::1, pods from .2. Underlay: 192.168.88.i and fd89::i, the
// external host 192.168.88.254 and fd89::fe. ClusterIPs: 10.96.0.0/16 and
// fd96::/112.
var (
	ClusterV4  = netip.MustParsePrefix("10.88.0.0/16")
	ClusterV6  = netip.MustParsePrefix("fd88::/32")
	UnderlayV4 = netip.MustParsePrefix("192.168.88.0/24")
	UnderlayV6 = netip.MustParsePrefix("fd89::/64")
	ServiceV4  = netip.MustParsePrefix("10.96.0.0/16")
	ServiceV6  = netip.MustParsePrefix("fd96::/112")
)

// MaxNodes and MaxPodsPerNode keep addresses and link names in range.
const (
	MaxNodes       = 50
	MaxPodsPerNode = 200
)

// Options configure a lab. The zero value of a field is its default.
type Options struct {
	// Name (1..6 of [a-z0-9]) names every resource; labs alive at once
	// need distinct names.
	Name string
	// Nodes: 1..MaxNodes, default 2.
	Nodes int
	// Mode: HostGW (default) or VXLAN.
	Mode Mode
	// UnderlayMTU is the MTU of the underlay bridge and every uplink
	// (default 1500). The VXLAN devices get UnderlayMTU-50.
	UnderlayMTU int
	// PodMTU is the MTU of pod veths and node bridges; by default what a
	// CNI would set: UnderlayMTU (host-gw) or the VXLAN device's MTU. Set
	// it above that for a lower-MTU path between nodes that PMTU discovery
	// must find (the node answers with ICMP frag-needed / packet-too-big).
	PodMTU int
	// ForwardPolicy is the policy of each node's FORWARD chain: "DROP"
	// (default; the lab's rules accept pod traffic) or "ACCEPT".
	ForwardPolicy string
	// NoFirewall: no firewall in the nodes (FORWARD accepts), so no rule
	// uses conntrack there and it does not run (the bypass stands by).
	NoFirewall bool
}

var nameRE = regexp.MustCompile(`^[a-z0-9]{1,6}$`)

func (o *Options) fill() error {
	if !nameRE.MatchString(o.Name) {
		return fmt.Errorf("multinode: name %q must be 1..6 characters of [a-z0-9]", o.Name)
	}
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		return fmt.Errorf("multinode: %d nodes out of range 1..%d", o.Nodes, MaxNodes)
	}
	switch o.Mode {
	case "":
		o.Mode = HostGW
	case HostGW, VXLAN:
	default:
		return fmt.Errorf("multinode: mode %q: want %q or %q", o.Mode, HostGW, VXLAN)
	}
	if o.UnderlayMTU == 0 {
		o.UnderlayMTU = 1500
	}
	// IPv6 needs 1280 on every link, the VXLAN device included.
	minUnder := 1280
	if o.Mode == VXLAN {
		minUnder += vxlanOverhead
	}
	if o.UnderlayMTU < minUnder || o.UnderlayMTU > 9000 {
		return fmt.Errorf("multinode: underlay MTU %d out of range %d..9000 for mode %s", o.UnderlayMTU, minUnder, o.Mode)
	}
	if o.PodMTU == 0 {
		o.PodMTU = o.UnderlayMTU
		if o.Mode == VXLAN {
			o.PodMTU -= vxlanOverhead
		}
	}
	if o.PodMTU < 1280 || o.PodMTU > 9000 {
		return fmt.Errorf("multinode: pod MTU %d out of range 1280..9000", o.PodMTU)
	}
	switch o.ForwardPolicy {
	case "":
		o.ForwardPolicy = "DROP"
	case "DROP", "ACCEPT":
	default:
		return fmt.Errorf("multinode: FORWARD policy %q: want DROP or ACCEPT", o.ForwardPolicy)
	}
	return nil
}

// Lab is a running cluster. Close removes it.
type Lab struct {
	Options
	Nodes []*Node
	// Underlay is the namespace holding the underlay bridge UnderlayBridge.
	Underlay       string
	UnderlayBridge string
	External       *External
	// Cgroup is the lab's cgroup tree (<root>/ezl-<name>).
	Cgroup string

	holder *netlab.Lab

	mu       sync.Mutex
	pods     []*Pod
	services []*Service
}

// Node is one lab node.
type Node struct {
	Index int    // 1..Nodes
	Name  string // n<Index>
	NetNS string
	// Devices in NetNS (Devices lists them with their roles).
	Bridge, Uplink, VXLAN string // VXLAN "" in host-gw mode
	// UplinkPeer is the uplink's other end, a port of the underlay bridge.
	UplinkPeer             string
	UnderlayV4, UnderlayV6 netip.Addr
	PodCIDRv4, PodCIDRv6   netip.Prefix
	GatewayV4, GatewayV6   netip.Addr // on Bridge
	// VTEP addresses on the VXLAN device (the pod CIDR's first address, as
	// Flannel does) and its MAC; zero in host-gw mode.
	VTEPv4, VTEPv6 netip.Addr
	VTEPMAC        net.HardwareAddr
	// System is the cgroup of processes of the node itself (an agent);
	// Managed and Unmanaged hold the pods' cgroups.
	System, Managed, Unmanaged string

	lab  *Lab
	pods []*Pod
}

// External is the off-cluster host on the underlay.
type External struct {
	NetNS      string
	IPv4, IPv6 netip.Addr
	Cgroup     string
	Veth       string // in the underlay namespace
}

// New builds the lab: underlay, nodes, routes, firewalls. Pods are added
// with AddPod. On error everything made is removed.
func New(o Options) (_ *Lab, err error) {
	if err := o.fill(); err != nil {
		return nil, err
	}
	root, err := cgroupv2.Root()
	if err != nil {
		return nil, err
	}
	holder, err := netlab.Holder(o.Name) // claims the name, sweeps a dead owner's leftovers
	if err != nil {
		return nil, err
	}
	l := &Lab{
		Options:        o,
		Underlay:       nsName(o.Name, "ul"),
		UnderlayBridge: linkName(o.Name, "ulbr"),
		Cgroup:         filepath.Join(root, Prefix+"-"+o.Name),
		holder:         holder,
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := netlab.SharedNetnsDir(); err != nil {
		return nil, err
	}
	l.External = &External{
		NetNS:  nsName(o.Name, "ext"),
		IPv4:   nth(UnderlayV4, 254),
		IPv6:   nth(UnderlayV6, 0xfe),
		Cgroup: filepath.Join(l.Cgroup, "ext"),
		Veth:   linkName(o.Name, "ext"),
	}
	for i := 1; i <= o.Nodes; i++ {
		n := &Node{
			Index:      i,
			Name:       fmt.Sprintf("n%d", i),
			NetNS:      nsName(o.Name, fmt.Sprintf("n%d", i)),
			Bridge:     linkName(o.Name, fmt.Sprintf("%dbr", i)),
			Uplink:     linkName(o.Name, fmt.Sprintf("%dup", i)),
			UplinkPeer: linkName(o.Name, fmt.Sprintf("%dul", i)),
			UnderlayV4: nth(UnderlayV4, i),
			UnderlayV6: nth(UnderlayV6, i),
			PodCIDRv4:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 88, byte(i), 0}), 24),
			PodCIDRv6:  netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x88, 0, 0, 0, byte(i)}), 64),
			lab:        l,
		}
		n.GatewayV4, n.GatewayV6 = nth(n.PodCIDRv4, 1), nth(n.PodCIDRv6, 1)
		if o.Mode == VXLAN {
			n.VXLAN = linkName(o.Name, fmt.Sprintf("%dvx", i))
			n.VTEPv4, n.VTEPv6 = n.PodCIDRv4.Addr(), n.PodCIDRv6.Addr()
			n.VTEPMAC = net.HardwareAddr{0x02, 0x65, 0x7a, 0, 0, byte(i)}
		}
		nodeCg := filepath.Join(l.Cgroup, n.Name)
		n.System = filepath.Join(nodeCg, "system")
		n.Managed = filepath.Join(nodeCg, "managed")
		n.Unmanaged = filepath.Join(nodeCg, "unmanaged")
		l.Nodes = append(l.Nodes, n)
	}
	if err := l.mkCgroups(); err != nil {
		return nil, err
	}
	if err := l.mkUnderlay(); err != nil {
		return nil, err
	}
	for _, n := range l.Nodes {
		if err := n.create(); err != nil {
			return nil, fmt.Errorf("multinode: node %s: %w", n.Name, err)
		}
	}
	if err := l.mkExternal(); err != nil {
		return nil, err
	}
	for _, n := range l.Nodes {
		if err := n.mkRoutes(); err != nil {
			return nil, fmt.Errorf("multinode: routes of %s: %w", n.Name, err)
		}
		if l.NoFirewall {
			continue
		}
		if err := n.mkFirewall(); err != nil {
			return nil, fmt.Errorf("multinode: firewall of %s: %w", n.Name, err)
		}
	}
	return l, nil
}

func nsName(lab, what string) string { return Prefix + "-" + lab + "-" + what }

// linkName is <Prefix><lab><what>: at most 3+6+6 = 15 bytes (IFNAMSIZ-1).
func linkName(lab, what string) string {
	n := Prefix + lab + what
	if len(n) > unix.IFNAMSIZ-1 {
		panic("multinode: link name too long: " + n) // bounded by fill and the Max* constants
	}
	return n
}

// nth is the address k after p's first address.
func nth(p netip.Prefix, k int) netip.Addr {
	b := p.Addr().As16()
	for i := 15; i >= 0 && k > 0; i-- {
		s := int(b[i]) + k
		b[i] = byte(s)
		k = s >> 8
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		a = a.Unmap()
	}
	return a
}

func (l *Lab) mkCgroups() error {
	dirs := []string{l.Cgroup, l.External.Cgroup}
	for _, n := range l.Nodes {
		dirs = append(dirs, filepath.Dir(n.System), n.System, n.Managed, n.Unmanaged)
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("multinode: cgroup %s: %w", d, err)
		}
	}
	return nil
}

// newNetns creates a named network namespace with lo up and returns a
// netlink handle in it (Close it).
func newNetns(name string) (*netlink.Handle, error) {
	var h *netlink.Handle
	err := make(chan error, 1)
	go func() {
		err <- func() error {
			// NewNamed switches the thread; it exits with the goroutine
			// unless it got back.
			runtime.LockOSThread()
			host, e := netns.Get()
			if e != nil {
				return e
			}
			defer host.Close()
			ns, e := netns.NewNamed(name)
			if e != nil {
				return fmt.Errorf("netns %s: %w", name, e)
			}
			defer ns.Close()
			// No DAD: a router whose link-local address is still
			// tentative sends no neighbour solicitation for forwarded
			// packets, stalling the first ones for seconds.
			if e := writeSysctls(map[string]string{
				"net/ipv6/conf/all/accept_dad":     "0",
				"net/ipv6/conf/default/accept_dad": "0",
			}); e != nil {
				return fmt.Errorf("in %s: %w", name, e)
			}
			if e := netns.Set(host); e == nil {
				runtime.UnlockOSThread()
			}
			h, e = netlink.NewHandleAt(ns)
			if e != nil {
				return fmt.Errorf("netlink in %s: %w", name, e)
			}
			return nil
		}()
	}()
	if e := <-err; e != nil {
		return nil, e
	}
	lo, e := h.LinkByName("lo")
	if e == nil {
		e = h.LinkSetUp(lo)
	}
	if e != nil {
		h.Close()
		return nil, fmt.Errorf("lo in %s: %w", name, e)
	}
	return h, nil
}

// handle is a netlink handle in the named namespace (route, netfilter and
// sock_diag families); Close it.
func handle(ns string) (*netlink.Handle, error) { return netlab.NetnsHandle(ns) }

func nsFd(name string) (netns.NsHandle, error) {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return ns, fmt.Errorf("netns %s: %w", name, err)
	}
	return ns, nil
}

// nodad is IFA_F_NODAD: IPv6 addresses usable at once.
const nodad = unix.IFA_F_NODAD

func addAddrs(h *netlink.Handle, link netlink.Link, addrs ...netip.Prefix) error {
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}
		if a.Addr().Is6() {
			addr.Flags = nodad
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("address %s on %s: %w", a, link.Attrs().Name, err)
		}
	}
	return nil
}

func (l *Lab) mkUnderlay() error {
	h, err := newNetns(l.Underlay)
	if err != nil {
		return err
	}
	defer h.Close()
	off := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: l.UnderlayBridge, MTU: l.UnderlayMTU}, MulticastSnooping: &off}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("multinode: underlay bridge: %w", err)
	}
	if err := h.LinkSetUp(br); err != nil {
		return err
	}
	// The underlay is a plain switch: no netfilter on bridged frames.
	return netlab.InNetns(l.Underlay, func() error {
		return writeSysctls(map[string]string{
			"net/bridge/bridge-nf-call-iptables":  "0",
			"net/bridge/bridge-nf-call-ip6tables": "0",
		})
	})
}

func writeSysctls(kv map[string]string) error {
	for k, v := range kv {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", k, err)
		}
	}
	return nil
}

// uplink makes a veth: name in the namespace of h, peer in the underlay
// namespace as a port of the underlay bridge; returns the name side.
func (l *Lab) uplink(h *netlink.Handle, name, peer string, mtu int) (netlink.Link, error) {
	ul, err := nsFd(l.Underlay)
	if err != nil {
		return nil, err
	}
	defer ul.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: mtu},
		PeerName:      peer,
		PeerNamespace: netlink.NsFd(int(ul)),
	}
	if err := h.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("veth %s/%s: %w", name, peer, err)
	}
	uh, err := handle(l.Underlay)
	if err != nil {
		return nil, err
	}
	defer uh.Close()
	br, err := uh.LinkByName(l.UnderlayBridge)
	if err != nil {
		return nil, err
	}
	p, err := uh.LinkByName(peer)
	if err != nil {
		return nil, err
	}
	if err := uh.LinkSetMTU(p, mtu); err != nil {
		return nil, err
	}
	if err := uh.LinkSetMasterByIndex(p, br.Attrs().Index); err != nil {
		return nil, fmt.Errorf("%s into %s: %w", peer, l.UnderlayBridge, err)
	}
	if err := uh.LinkSetUp(p); err != nil {
		return nil, err
	}
	lk, err := h.LinkByName(name)
	if err != nil {
		return nil, err
	}
	return lk, h.LinkSetUp(lk)
}

func (l *Lab) mkExternal() error {
	h, err := newNetns(l.External.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	// The veth is made in the underlay namespace, its peer eth0 in the
	// external one.
	uh, err := handle(l.Underlay)
	if err != nil {
		return err
	}
	defer uh.Close()
	ext, err := nsFd(l.External.NetNS)
	if err != nil {
		return err
	}
	defer ext.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: l.External.Veth, MTU: l.UnderlayMTU},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ext)),
	}
	if err := uh.LinkAdd(veth); err != nil {
		return fmt.Errorf("multinode: external veth: %w", err)
	}
	br, err := uh.LinkByName(l.UnderlayBridge)
	if err != nil {
		return err
	}
	p, err := uh.LinkByName(l.External.Veth)
	if err != nil {
		return err
	}
	if err := uh.LinkSetMasterByIndex(p, br.Attrs().Index); err != nil {
		return err
	}
	if err := uh.LinkSetUp(p); err != nil {
		return err
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.LinkSetMTU(eth, l.UnderlayMTU); err != nil {
		return err
	}
	if err := addAddrs(h, eth, netip.PrefixFrom(l.External.IPv4, UnderlayV4.Bits()), netip.PrefixFrom(l.External.IPv6, UnderlayV6.Bits())); err != nil {
		return err
	}
	return h.LinkSetUp(eth)
}

func (n *Node) create() error {
	l := n.lab
	h, err := newNetns(n.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	// Per-namespace sysctls (bridge-nf-call-* are per netns since 5.3): a
	// router whose bridged pod traffic passes iptables, as Kubernetes needs.
	err = netlab.InNetns(n.NetNS, func() error {
		return writeSysctls(map[string]string{
			"net/ipv4/ip_forward":                 "1",
			"net/ipv6/conf/all/forwarding":        "1",
			"net/bridge/bridge-nf-call-iptables":  "1",
			"net/bridge/bridge-nf-call-ip6tables": "1",
		})
	})
	if err != nil {
		return err
	}
	up, err := l.uplink(h, n.Uplink, n.UplinkPeer, l.UnderlayMTU)
	if err != nil {
		return err
	}
	if err := addAddrs(h, up, netip.PrefixFrom(n.UnderlayV4, UnderlayV4.Bits()), netip.PrefixFrom(n.UnderlayV6, UnderlayV6.Bits())); err != nil {
		return err
	}
	off := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Bridge, MTU: l.PodMTU}, MulticastSnooping: &off}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("bridge %s: %w", n.Bridge, err)
	}
	if err := addAddrs(h, br, netip.PrefixFrom(n.GatewayV4, 24), netip.PrefixFrom(n.GatewayV6, 64)); err != nil {
		return err
	}
	if err := h.LinkSetUp(br); err != nil {
		return err
	}
	if l.Mode != VXLAN {
		return nil
	}
	vx := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: n.VXLAN, MTU: l.UnderlayMTU - vxlanOverhead, HardwareAddr: n.VTEPMAC},
		VxlanId:      1,
		VtepDevIndex: up.Attrs().Index,
		SrcAddr:      n.UnderlayV4.AsSlice(),
		Port:         VXLANPort,
		Learning:     false,
	}
	if err := h.LinkAdd(vx); err != nil {
		return fmt.Errorf("vxlan %s: %w", n.VXLAN, err)
	}
	lk, err := h.LinkByName(n.VXLAN)
	if err != nil {
		return err
	}
	if err := addAddrs(h, lk, netip.PrefixFrom(n.VTEPv4, 32), netip.PrefixFrom(n.VTEPv6, 128)); err != nil {
		return err
	}
	return h.LinkSetUp(lk)
}

// mkRoutes adds the routes to every other node's pod CIDRs.
func (n *Node) mkRoutes() error {
	h, err := handle(n.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	dev := n.Uplink
	if n.lab.Mode == VXLAN {
		dev = n.VXLAN
	}
	lk, err := h.LinkByName(dev)
	if err != nil {
		return err
	}
	idx := lk.Attrs().Index
	for _, r := range n.lab.Nodes {
		if r == n {
			continue
		}
		type hop struct {
			dst netip.Prefix
			via netip.Addr
		}
		hops := []hop{{r.PodCIDRv4, r.UnderlayV4}, {r.PodCIDRv6, r.UnderlayV6}}
		flags := 0
		if n.lab.Mode == VXLAN {
			hops = []hop{{r.PodCIDRv4, r.VTEPv4}, {r.PodCIDRv6, r.VTEPv6}}
			flags = int(netlink.FLAG_ONLINK)
			// Flannel's static entries: the remote VTEP's MAC for its
			// addresses, and where that MAC lives on the underlay.
			fdb := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF, State: netlink.NUD_PERMANENT,
				IP: r.UnderlayV4.AsSlice(), HardwareAddr: r.VTEPMAC}
			if err := h.NeighAppend(fdb); err != nil {
				return fmt.Errorf("fdb %s dst %s: %w", r.VTEPMAC, r.UnderlayV4, err)
			}
			for _, a := range []netip.Addr{r.VTEPv4, r.VTEPv6} {
				fam := unix.AF_INET
				if a.Is6() {
					fam = unix.AF_INET6
				}
				nb := &netlink.Neigh{LinkIndex: idx, Family: fam, State: netlink.NUD_PERMANENT, IP: a.AsSlice(), HardwareAddr: r.VTEPMAC}
				if err := h.NeighSet(nb); err != nil {
					return fmt.Errorf("neighbour %s: %w", a, err)
				}
			}
		}
		for _, hp := range hops {
			rt := &netlink.Route{LinkIndex: idx, Dst: prefixNet(hp.dst), Gw: hp.via.AsSlice(), Flags: flags}
			if err := h.RouteAdd(rt); err != nil {
				return fmt.Errorf("route %s via %s dev %s: %w", hp.dst, hp.via, dev, err)
			}
		}
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Node returns node i (1-based).
func (l *Lab) Node(i int) *Node {
	if i < 1 || i > len(l.Nodes) {
		return nil
	}
	return l.Nodes[i-1]
}

// Pods returns every pod in creation order.
func (l *Lab) Pods() []*Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Pod(nil), l.pods...)
}

// Pod returns the pod named name, or nil.
func (l *Lab) Pod(name string) *Pod {
	for _, p := range l.Pods() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Pods returns the node's pods in creation order.
func (n *Node) Pods() []*Pod {
	n.lab.mu.Lock()
	defer n.lab.mu.Unlock()
	return append([]*Pod(nil), n.pods...)
}

// Close kills every process in the lab's cgroups and removes its
// namespaces (with every link, route and iptables rule in them), cgroups
// and owner record. It keeps going after errors and returns them joined.
func (l *Lab) Close() error {
	netlab.KillCgroupTree(l.Cgroup)
	var errs []error
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), Prefix+"-"+l.Name+"-") {
			if err := netlab.DeleteNetns(e.Name()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if l.holder != nil {
		// Removes the cgroup tree and the owner record.
		if err := l.holder.Close(); err != nil {
			errs = append(errs, err)
		}
		l.holder = nil
	}
	return errors.Join(errs...)
}

// Sweep removes what labs (of this package or netlab) of killed processes
// left behind.
func Sweep() error { return netlab.Sweep() }

// Describe writes the layout: nodes, devices, addresses, pods, services.
func (l *Lab) Describe(w io.Writer) {
	fmt.Fprintf(w, "lab %s: %d nodes, mode %s, underlay MTU %d, pod MTU %d, FORWARD policy %s\n",
		l.Name, len(l.Nodes), l.Mode, l.UnderlayMTU, l.PodMTU, l.ForwardPolicy)
	fmt.Fprintf(w, "underlay: netns %s, bridge %s, %s %s\n", l.Underlay, l.UnderlayBridge, UnderlayV4, UnderlayV6)
	fmt.Fprintf(w, "external: netns %s, %s %s\n", l.External.NetNS, l.External.IPv4, l.External.IPv6)
	for _, n := range l.Nodes {
		fmt.Fprintf(w, "node %s: netns %s, underlay %s %s on %s (peer %s), pods %s %s on %s (gw %s %s)\n",
			n.Name, n.NetNS, n.UnderlayV4, n.UnderlayV6, n.Uplink, n.UplinkPeer, n.PodCIDRv4, n.PodCIDRv6, n.Bridge, n.GatewayV4, n.GatewayV6)
		if n.VXLAN != "" {
			fmt.Fprintf(w, "  vxlan %s: vni 1 port %d, vtep %s %s mac %s\n", n.VXLAN, VXLANPort, n.VTEPv4, n.VTEPv6, n.VTEPMAC)
		}
		fmt.Fprintf(w, "  cgroups: system %s, managed %s\n", n.System, n.Managed)
		for _, p := range n.Pods() {
			fmt.Fprintf(w, "  pod %s: netns %s, %s %s, veth %s, cgroup %s\n", p.Name, p.NetNS, p.IPv4, p.IPv6, p.HostVeth, p.Cgroup)
		}
	}
	for _, s := range l.Services() {
		fmt.Fprintf(w, "service %s: %s %s port %d/%s ->", s.Name, s.VIPv4, s.VIPv6, s.Port, s.Proto)
		for _, b := range s.Backends {
			fmt.Fprintf(w, " %s:%d", b.Name, s.TargetPort)
		}
		fmt.Fprintln(w)
	}
}
