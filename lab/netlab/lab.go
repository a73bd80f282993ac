// Package netlab builds a node from network namespaces: pods on a Linux
// bridge (the CNI), each with a cgroup v2 of its own, and runs commands in
// them. Tests and `eztunnel bench` use it; Close removes everything it made.
package netlab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
)

// Prefix starts the name of every netns, link and cgroup a lab creates, so
// Sweep can find leftovers of a killed run.
const Prefix = "ezl"

// Lab is one node: a bridge in the host namespace and pods attached to it.
type Lab struct {
	Name   string
	Bridge string
	// Managed is the cgroup subtree the datapath is attached to; pods made
	// with managed=false live in a sibling subtree it does not see.
	Managed   string
	Unmanaged string
	cgRoot    string
	subnet    int
	GatewayV4 netip.Addr
	GatewayV6 netip.Addr

	mu   sync.Mutex
	pods []*Pod
}

// Pod is one network namespace with a veth to the bridge and a cgroup.
type Pod struct {
	Name    string
	NetNS   string // name under /run/netns
	Cgroup  string
	IPv4    netip.Addr
	IPv6    netip.Addr
	Managed bool
	lab     *Lab
}

// New creates the bridge and the cgroup subtrees. subnet (1..250) picks
// 10.77.<subnet>.0/24 and fd77:<subnet>::/64; labs alive at once need
// distinct names and subnets.
func New(name string, subnet int) (_ *Lab, err error) {
	if len(name) > 6 || name == "" {
		return nil, fmt.Errorf("netlab: name %q must be 1..6 characters", name)
	}
	if subnet < 1 || subnet > 250 {
		return nil, fmt.Errorf("netlab: subnet %d out of range 1..250", subnet)
	}
	cg, err := cgroupv2.Root()
	if err != nil {
		return nil, err
	}
	l := &Lab{
		Name:      name,
		Bridge:    fmt.Sprintf("%s%sbr", Prefix, name),
		cgRoot:    filepath.Join(cg, Prefix+"-"+name),
		subnet:    subnet,
		GatewayV4: netip.MustParseAddr(fmt.Sprintf("10.77.%d.1", subnet)),
		GatewayV6: netip.MustParseAddr(fmt.Sprintf("fd77:%d::1", subnet)),
	}
	l.Managed = filepath.Join(l.cgRoot, "managed")
	l.Unmanaged = filepath.Join(l.cgRoot, "unmanaged")
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if err := claim(name); err != nil {
		return nil, err
	}
	for _, p := range []string{fmt.Sprintf("10.77.%d.0/24", subnet), fmt.Sprintf("fd77:%d::/64", subnet)} {
		if _, err := l.Record(RecConntrack, p); err != nil {
			return nil, err
		}
	}
	if err := sharedNetnsDir(); err != nil {
		return nil, err
	}
	for _, d := range []string{l.cgRoot, l.Managed, l.Unmanaged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, fmt.Errorf("netlab: cgroup %s: %w", d, err)
		}
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: l.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, fmt.Errorf("netlab: add bridge %s: %w", l.Bridge, err)
	}
	for _, a := range []string{l.GatewayV4.String() + "/24", l.GatewayV6.String() + "/64"} {
		addr, _ := netlink.ParseAddr(a)
		addr.Flags = nodad
		if err := netlink.AddrAdd(br, addr); err != nil {
			return nil, fmt.Errorf("netlab: address %s on %s: %w", a, l.Bridge, err)
		}
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("netlab: up %s: %w", l.Bridge, err)
	}
	return l, nil
}

// Holder claims name for resource records only (Record), for resources a
// lab of another process makes, e.g. the pins of a `bench lab` child: if
// this process dies, Sweep undoes them. Close undoes and releases.
func Holder(name string) (*Lab, error) {
	if len(name) > 6 || name == "" {
		return nil, fmt.Errorf("netlab: name %q must be 1..6 characters", name)
	}
	if err := claim(name); err != nil {
		return nil, err
	}
	cg, err := cgroupv2.Root()
	if err != nil {
		release(name)
		return nil, err
	}
	return &Lab{Name: name, Bridge: fmt.Sprintf("%s%sbr", Prefix, name), cgRoot: filepath.Join(cg, Prefix+"-"+name)}, nil
}

// sharedNetnsDir makes /run/netns a shared mount of itself, as `ip netns`
// does on first use. Otherwise a later `ip netns add` mounts /run/netns
// over the netns mounts made before it: their names stay visible as plain
// files that cannot be unmounted by path.
func sharedNetnsDir() error {
	const dir = "/run/netns"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == unix.EINVAL { // not a mount point yet
		if err = unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("netlab: make %s a shared mount: %w", dir, err)
	}
	return nil
}

// deleteNetns removes a named netns. A name whose mount a later mount of
// /run/netns hid is a plain file here (umount: EINVAL): remove the name.
func deleteNetns(name string) error {
	err := netns.DeleteNamed(name)
	if errors.Is(err, unix.EINVAL) {
		err = os.Remove(filepath.Join("/run/netns", name))
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete netns %s: %w", name, err)
	}
	return nil
}

// nodad is IFA_F_NODAD: IPv6 addresses usable at once.
const nodad = 0x02

// AddPod creates a pod with the next free address. managed places its
// cgroup under the datapath's subtree.
func (l *Lab) AddPod(name string, managed bool) (_ *Pod, err error) {
	l.mu.Lock()
	idx := len(l.pods) + 2
	l.mu.Unlock()
	if len(name) > 5 {
		return nil, fmt.Errorf("netlab: pod name %q longer than 5 characters", name)
	}
	p := &Pod{
		Name:    name,
		NetNS:   fmt.Sprintf("%s-%s-%s", Prefix, l.Name, name),
		IPv4:    netip.MustParseAddr(fmt.Sprintf("10.77.%d.%d", l.subnet, idx)),
		IPv6:    netip.MustParseAddr(fmt.Sprintf("fd77:%d::%x", l.subnet, idx)),
		Managed: managed,
		lab:     l,
	}
	parent := l.Unmanaged
	if managed {
		parent = l.Managed
	}
	p.Cgroup = filepath.Join(parent, name)
	if err := os.Mkdir(p.Cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("netlab: cgroup %s: %w", p.Cgroup, err)
	}
	l.mu.Lock()
	l.pods = append(l.pods, p)
	l.mu.Unlock()
	if err := p.create(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *Pod) hostVeth() string { return fmt.Sprintf("%s%s%s", Prefix, p.lab.Name, p.Name) }

// create makes the namespace and the veth pair, configured from inside.
func (p *Pod) create() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := netns.Get()
	if err != nil {
		return err
	}
	defer host.Close()
	ns, err := netns.NewNamed(p.NetNS) // switches this thread into it
	if err != nil {
		return fmt.Errorf("netlab: netns %s: %w", p.NetNS, err)
	}
	defer ns.Close()
	if err := netns.Set(host); err != nil {
		return err
	}

	br, err := netlink.LinkByName(p.lab.Bridge)
	if err != nil {
		return err
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: p.hostVeth(), MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("netlab: veth for %s: %w", p.Name, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return err
	}

	h, err := loopbackUp(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	for _, a := range []string{p.IPv4.String() + "/24", p.IPv6.String() + "/64"} {
		addr, _ := netlink.ParseAddr(a)
		addr.Flags = nodad
		if err := h.AddrAdd(eth, addr); err != nil {
			return fmt.Errorf("netlab: address %s in %s: %w", a, p.NetNS, err)
		}
	}
	if err := h.LinkSetUp(eth); err != nil {
		return err
	}
	for _, gw := range []netip.Addr{p.lab.GatewayV4, p.lab.GatewayV6} {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("netlab: default route via %s in %s: %w", gw, p.NetNS, err)
		}
	}
	return nil
}

// Pods returns the pods in creation order.
func (l *Lab) Pods() []*Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*Pod(nil), l.pods...)
}

// Close kills every process left in the lab's cgroups and removes pods,
// bridge and cgroups, and the host's conntrack entries of its subnets. It keeps going after errors and returns them joined.
func (l *Lab) Close() error {
	var errs []error
	killCgroupTree(l.cgRoot)
	for _, p := range l.Pods() {
		if lk, err := netlink.LinkByName(p.hostVeth()); err == nil {
			if err := netlink.LinkDel(lk); err != nil {
				errs = append(errs, err)
			}
		}
		if err := deleteNetns(p.NetNS); err != nil {
			errs = append(errs, err)
		}
	}
	if lk, err := netlink.LinkByName(l.Bridge); err == nil {
		if err := netlink.LinkDel(lk); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroupTree(l.cgRoot); err != nil {
		errs = append(errs, err)
	}
	// The lab's conntrack entries go before its records restore a smaller
	// nf_conntrack_max (bench scale), so the table is never over it.
	if err := undoConntrack(l.Name); err != nil {
		errs = append(errs, err)
	}
	if err := undoRecords(l.Name); err != nil {
		errs = append(errs, err)
	}
	release(l.Name)
	return errors.Join(errs...)
}

// Sweep removes what labs of killed runs left behind: the namespaces, links
// and cgroups of every lab whose owning process is gone, and the resources
// its owner record lists (pins, host nftables chains and tables, sysctls). Labs of live
// processes (another test binary running now) are left alone.
func Sweep() error {
	var errs []error
	for _, name := range staleLabs() {
		if err := errors.Join(undoRecords(name), sweepLab(name), undoConntrack(name)); err != nil {
			errs = append(errs, err)
		}
		release(name)
	}
	return errors.Join(errs...)
}

func sweepLab(name string) error {
	var errs []error
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), Prefix+"-"+name+"-") {
			if err := deleteNetns(e.Name()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	links, _ := netlink.LinkList()
	for _, lk := range links {
		if strings.HasPrefix(lk.Attrs().Name, Prefix+name) {
			// A veth goes with its peer's namespace, asynchronously: ENODEV
			// means it is gone already.
			if err := netlink.LinkDel(lk); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete link %s: %w", lk.Attrs().Name, err))
			}
		}
	}
	if root, err := cgroupv2.Root(); err == nil {
		d := filepath.Join(root, Prefix+"-"+name)
		if _, err := os.Stat(d); err == nil {
			killCgroupTree(d)
			if err := removeCgroupTree(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// SharedNetnsDir makes /run/netns a shared mount of itself (see
// sharedNetnsDir), for other lab packages that name namespaces.
func SharedNetnsDir() error { return sharedNetnsDir() }

// DeleteNetns removes a named netns; a name already gone is not an error.
func DeleteNetns(name string) error { return deleteNetns(name) }
