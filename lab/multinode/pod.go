package multinode

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"

	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/lab/netlab"
)

// Pod is a network namespace with eth0, a veth to its node's bridge, and a
// cgroup of its own.
type Pod struct {
	Name       string
	Node       *Node
	NetNS      string
	Cgroup     string
	IPv4, IPv6 netip.Addr
	// HostVeth is the pod's veth in the node namespace, a bridge port.
	HostVeth string
	Managed  bool
}

var podNameRE = regexp.MustCompile(`^[a-z0-9]{1,8}$`)

// AddPod creates a pod on node n with the next free addresses of its pod
// CIDR. managed places its cgroup under n.Managed (the subtree a node's
// agent is given), otherwise under n.Unmanaged. Names are unique in a lab.
func (n *Node) AddPod(name string, managed bool) (*Pod, error) {
	l := n.lab
	if !podNameRE.MatchString(name) {
		return nil, fmt.Errorf("multinode: pod name %q must be 1..8 characters of [a-z0-9]", name)
	}
	l.mu.Lock()
	for _, p := range l.pods {
		if p.Name == name {
			l.mu.Unlock()
			return nil, fmt.Errorf("multinode: pod %q exists already (on %s)", name, p.Node.Name)
		}
	}
	j := len(n.pods) + 1
	if j > MaxPodsPerNode {
		l.mu.Unlock()
		return nil, fmt.Errorf("multinode: node %s has %d pods already", n.Name, MaxPodsPerNode)
	}
	p := &Pod{
		Name:     name,
		Node:     n,
		NetNS:    nsName(l.Name, n.Name+"-"+name),
		IPv4:     nth(n.PodCIDRv4, j+1),
		IPv6:     nth(n.PodCIDRv6, j+1),
		HostVeth: linkName(l.Name, fmt.Sprintf("%dp%d", n.Index, j)),
		Managed:  managed,
	}
	parent := n.Unmanaged
	if managed {
		parent = n.Managed
	}
	p.Cgroup = filepath.Join(parent, name)
	// Listed before it exists, so Close removes a half-made pod.
	n.pods = append(n.pods, p)
	l.pods = append(l.pods, p)
	l.mu.Unlock()
	if err := os.Mkdir(p.Cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("multinode: cgroup %s: %w", p.Cgroup, err)
	}
	if err := p.create(); err != nil {
		return nil, fmt.Errorf("multinode: pod %s: %w", name, err)
	}
	return p, nil
}

func (p *Pod) create() error {
	n, l := p.Node, p.Node.lab
	h, err := newNetns(p.NetNS)
	if err != nil {
		return err
	}
	defer h.Close()
	nh, err := handle(n.NetNS)
	if err != nil {
		return err
	}
	defer nh.Close()
	br, err := nh.LinkByName(n.Bridge)
	if err != nil {
		return err
	}
	pns, err := nsFd(p.NetNS)
	if err != nil {
		return err
	}
	defer pns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: p.HostVeth, MTU: l.PodMTU, MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(pns)),
	}
	if err := nh.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth %s: %w", p.HostVeth, err)
	}
	hv, err := nh.LinkByName(p.HostVeth)
	if err != nil {
		return err
	}
	if err := nh.LinkSetUp(hv); err != nil {
		return err
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	if err := h.LinkSetMTU(eth, l.PodMTU); err != nil {
		return err
	}
	if err := addAddrs(h, eth, netip.PrefixFrom(p.IPv4, n.PodCIDRv4.Bits()), netip.PrefixFrom(p.IPv6, n.PodCIDRv6.Bits())); err != nil {
		return err
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	for _, gw := range []netip.Addr{n.GatewayV4, n.GatewayV6} {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("default route via %s: %w", gw, err)
		}
	}
	return nil
}

// Addr returns the pod's IPv4 (v6 false) or IPv6 address.
func (p *Pod) Addr(v6 bool) netip.Addr {
	if v6 {
		return p.IPv6
	}
	return p.IPv4
}

// Cmd prepares a command in the pod's namespace; Start or Run it to place
// it in the pod's cgroup too.
func (p *Pod) Cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	return netlab.NetnsCmd(ctx, p.NetNS, name, args...)
}

// Start starts cmd in the pod's cgroup (from its first instruction).
func (p *Pod) Start(cmd *exec.Cmd) error { return netlab.StartInCgroup(cmd, p.Cgroup) }

// Run starts cmd in the pod's cgroup and waits for it.
func (p *Pod) Run(cmd *exec.Cmd) error { return netlab.RunInCgroup(cmd, p.Cgroup) }

// Do runs fn on a thread in the pod's namespace; sockets it opens stay
// there. (The thread is not in the pod's cgroup.)
func (p *Pod) Do(fn func() error) error { return netlab.InNetns(p.NetNS, fn) }

// Handle is a netlink handle in the pod's namespace; Close it.
func (p *Pod) Handle() (*netlink.Handle, error) { return handle(p.NetNS) }

// Cmd prepares a command in the node's namespace; Start or Run it to place
// it in the node's System cgroup too.
func (n *Node) Cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	return netlab.NetnsCmd(ctx, n.NetNS, name, args...)
}

// Start starts cmd in the node's System cgroup.
func (n *Node) Start(cmd *exec.Cmd) error { return netlab.StartInCgroup(cmd, n.System) }

// Run starts cmd in the node's System cgroup and waits for it.
func (n *Node) Run(cmd *exec.Cmd) error { return netlab.RunInCgroup(cmd, n.System) }

// Do runs fn on a thread in the node's namespace.
func (n *Node) Do(fn func() error) error { return netlab.InNetns(n.NetNS, fn) }

// Handle is a netlink handle in the node's namespace; Close it.
func (n *Node) Handle() (*netlink.Handle, error) { return handle(n.NetNS) }

// Cmd prepares a command in the external host's namespace.
func (e *External) Cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	return netlab.NetnsCmd(ctx, e.NetNS, name, args...)
}

// Start starts cmd in the external host's cgroup.
func (e *External) Start(cmd *exec.Cmd) error { return netlab.StartInCgroup(cmd, e.Cgroup) }

// Run starts cmd in the external host's cgroup and waits for it.
func (e *External) Run(cmd *exec.Cmd) error { return netlab.RunInCgroup(cmd, e.Cgroup) }

// Do runs fn on a thread in the external host's namespace.
func (e *External) Do(fn func() error) error { return netlab.InNetns(e.NetNS, fn) }

// Role is what a device of a node is for.
type Role string

const (
	RoleBridge  Role = "bridge"   // the node's pod bridge
	RoleUplink  Role = "uplink"   // the veth to the underlay
	RoleVXLAN   Role = "vxlan"    // the overlay device (VXLAN mode)
	RolePodVeth Role = "pod-veth" // a pod's veth, node side
)

// Device is a link in a node's namespace.
type Device struct {
	Name  string
	Role  Role
	Index int  // ifindex in the node's namespace
	Pod   *Pod // for RolePodVeth
}

// Devices lists the node's devices with their roles and ifindexes, read
// from netlink: bridge, uplink, VXLAN device, then pod veths.
func (n *Node) Devices() ([]Device, error) {
	h, err := n.Handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	want := []Device{{Name: n.Bridge, Role: RoleBridge}, {Name: n.Uplink, Role: RoleUplink}}
	if n.VXLAN != "" {
		want = append(want, Device{Name: n.VXLAN, Role: RoleVXLAN})
	}
	for _, p := range n.Pods() {
		want = append(want, Device{Name: p.HostVeth, Role: RolePodVeth, Pod: p})
	}
	for i := range want {
		lk, err := h.LinkByName(want[i].Name)
		if err != nil {
			return nil, fmt.Errorf("multinode: %s %s in %s: %w", want[i].Role, want[i].Name, n.NetNS, err)
		}
		want[i].Index = lk.Attrs().Index
	}
	return want, nil
}

// Device returns the node's one device of role (bridge, uplink or vxlan).
func (n *Node) Device(role Role) (Device, error) {
	ds, err := n.Devices()
	if err != nil {
		return Device{}, err
	}
	if role == RolePodVeth {
		return Device{}, fmt.Errorf("multinode: a node has one %s per pod: use Devices", role)
	}
	for _, d := range ds {
		if d.Role == role {
			return d, nil
		}
	}
	return Device{}, fmt.Errorf("multinode: node %s has no %s device (mode %s)", n.Name, role, n.lab.Mode)
}
