package bypass

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/rtnl"
)

// Config says where the bypass runs.
type Config struct {
	// Options: what the flags ask of the programs (NoUDP, NoIPv6).
	Options
	// NetNS is the node's named network namespace (under /run/netns) that
	// holds the pod bridge and the pods' host-side veths; "" is the
	// caller's.
	NetNS string
	// TCPTimeout and UDPTimeout are the conntrack timeouts the bypass
	// refreshes established entries to while their packets skip
	// conntrack; 0 reads them from NetNS's nf_conntrack_tcp_timeout_established
	// and nf_conntrack_udp_timeout_stream.
	TCPTimeout, UDPTimeout time.Duration
	// AdmitMark is two bits of the conntrack mark that record which
	// directions of a flow the kernel path delivered (the lower bit: the
	// original direction); 0 is DefaultAdmitMark. Other users of the
	// conntrack mark (CONNMARK rules) must leave them alone.
	AdmitMark uint32
	// PinDir is the datapath's pin directory (<pin path>/<schema>): the
	// maps are pinned in PinDir/bypass and the tcx links under
	// PinDir/bypass/links/tcx/<netns cookie>/<ifindex>/<program>, so they
	// outlive the process. A later Load with the same PinDir reuses the maps and
	// Attach updates the pinned links in place. "": nothing is pinned and
	// Close detaches everything.
	PinDir string
}

// DefaultAdmitMark is AdmitMark's default.
const DefaultAdmitMark = 0x3 << 28

// maxTimeout: the kfunc takes milliseconds in a u32.
const maxTimeout = time.Duration(^uint32(0)) * time.Millisecond

// Bypass is a loaded bypass program with its maps and tcx links.
type Bypass struct {
	netns  string
	pinDir string // the family's directory <Config.PinDir>/bypass (pins.go); "": nothing pinned
	cookie uint64 // netns cookie (pinned links' directory)
	objs   bypassObjects
	links  map[int]attachment // by ifindex
	genMu  sync.Mutex         // orders the generation's writes
	gen    uint32             // ez_bp_flows_gen's value
	// stopRouting ends watchRouting (nil: not watching).
	stopRouting func()
	// recheck is Config.Recheck: how long the flow cache's checks stand.
	recheck time.Duration
}

// Recheck is how long a flow's cached checks stand (Config.Recheck).
func (b *Bypass) Recheck() time.Duration { return b.recheck }

// attachment is the tcx ingress program (ez_bypass on a pod veth,
// ez_bypass_in on an uplink) and egress ez_bypass_admit on one device.
type attachment struct {
	links  [2]*bpfsys.TCHook
	pins   [2]string // "": not pinned
	uplink bool
	dev    bypassEzBpDevice // its ez_bp_devices entry
}

// Endpoint is a local pod: its host-side veth (ifindex in the node's
// netns), its eth0 MAC and the MAC of the bridge the veth is a port of.
type Endpoint struct {
	Ifindex   int
	PodMAC    net.HardwareAddr
	BridgeMAC net.HardwareAddr
}

// sysctl reads /proc/sys/net/netfilter/<name> in the bypass's netns.
func sysctl(ns, name string) (v uint64, err error) {
	err = bpfsys.InNetNS(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/" + name)
		if err != nil {
			return err
		}
		v, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("bypass: sysctl net.netfilter.%s in netns %q (is conntrack active there?): %w", name, ns, err)
	}
	return v, nil
}

// Load checks the node's conntrack settings and loads the program; nothing
// is attached yet.
func Load(cfg Config) (_ *Bypass, err error) {
	if err := Check(&cfg); err != nil {
		return nil, err
	}
	spec, err := loadBypass()
	if err != nil {
		return nil, fmt.Errorf("bypass: %w", err)
	}
	if err := setVariables(spec, cfg); err != nil {
		return nil, fmt.Errorf("bypass: %w", err)
	}
	b := &Bypass{netns: cfg.NetNS, links: map[int]attachment{}, recheck: cfg.Recheck}
	if cfg.PinDir != "" {
		b.pinDir = mapDir(cfg.PinDir)
	}
	var opts *ebpf.CollectionOptions
	if cfg.PinDir != "" {
		if b.cookie, err = bpfsys.NetNSCookie(cfg.NetNS); err != nil {
			return nil, fmt.Errorf("bypass: %w", err)
		}
		if err := bpfsys.EnsureDir(mapDir(cfg.PinDir)); err != nil {
			return nil, fmt.Errorf("bypass: %w", err)
		}
		// The counters too: a restart keeps counting.
		for _, m := range spec.Maps {
			// Not the flow cache: a load starts with it empty and its
			// generation at 0.
			if strings.HasPrefix(m.Name, "ez_bp_") && m.Name != bypassMapEzBpFlows && m.Name != bypassMapEzBpFlowsGen {
				m.Pinning = ebpf.PinByName
			}
		}
		opts = &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapDir(cfg.PinDir)}}
		if err := bpfsys.GrowPinnedCounters(mapDir(cfg.PinDir), spec, bypassMapEzBpCounters); err != nil {
			return nil, fmt.Errorf("bypass: %w", err)
		}
	}
	if err := loadObjects(spec, opts, &b.objs); err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("bypass: pinned maps in %s do not match this build; run `eztunnel uninstall` first: %w", mapDir(cfg.PinDir), err)
		}
		return nil, err
	}
	// Every load starts unpaused (a bench's pause does not outlive it).
	if err := b.objs.EzBpSwitch.Update(uint32(0), bypassEzBpCtl{}, ebpf.UpdateAny); err != nil {
		b.objs.Close()
		return nil, fmt.Errorf("bypass: reset %s: %w", bypassMapEzBpSwitch, err)
	}
	if cfg.Recheck > 0 {
		if err := b.watchRouting(); err != nil {
			b.objs.Close()
			return nil, err
		}
	}
	return b, nil
}

// watchRouting starts bumping the flow cache's generation on the routing
// changes of the bypass's netns (routing.go).
func (b *Bypass) watchRouting() error {
	ns := netns.None()
	if b.netns != "" {
		h, err := netns.GetFromName(b.netns)
		if err != nil {
			return fmt.Errorf("bypass: netns %s: %w", b.netns, err)
		}
		defer h.Close()
		ns = h
	}
	stop, err := watchRouting(ns, b.flowsChanged)
	if err != nil {
		return fmt.Errorf("bypass: rtnetlink notifications in netns %q (the flow cache needs them; --bypass-recheck=0 turns it off): %w", b.netns, err)
	}
	b.stopRouting = stop
	return nil
}

// setVariables sets the programs' constants from cfg (checked): the
// admission mark bits, the conntrack refresh timeouts, the options.
func setVariables(spec *ebpf.CollectionSpec, cfg Config) error {
	lo := cfg.AdmitMark & -cfg.AdmitMark
	if err := checkRecheck(cfg.Recheck); err != nil {
		return fmt.Errorf("recheck %w", err)
	}
	// The flow cache's slots are picked by a seeded hash: a pod cannot
	// aim its flows at another pod's slots.
	var sb [4]byte
	if _, err := rand.Read(sb[:]); err != nil {
		return fmt.Errorf("flow cache seed: %w", err)
	}
	seed := binary.LittleEndian.Uint32(sb[:])
	flag := func(b bool) uint32 {
		if b {
			return 1
		}
		return 0
	}
	for name, v := range map[string]any{
		bypassVarEzBpAdmitMark:    [2]uint32{lo, cfg.AdmitMark &^ lo},
		bypassVarEzBpTcpTimeoutMs: uint32(cfg.TCPTimeout.Milliseconds()),
		bypassVarEzBpUdpTimeoutMs: uint32(cfg.UDPTimeout.Milliseconds()),
		bypassVarEzBpNoUdp:        flag(cfg.NoUDP),
		bypassVarEzBpNoIpv6:       flag(cfg.NoIPv6),
		bypassVarEzBpRecheckNs:    uint64(cfg.Recheck),
		bypassVarEzBpFlowsSeed:    seed,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// loadObjects loads the programs and maps and checks the kernel has tcx,
// which every program of the bypass attaches with (an UnmetError if not).
func loadObjects(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions, objs *bypassObjects) error {
	if err := spec.LoadAndAssign(objs, opts); err != nil {
		// cilium/ebpf names the program; the verifier's last lines follow.
		return fmt.Errorf("bypass: load: %w", err)
	}
	if err := bpfsys.TCAttachable(objs.EzBypass); err != nil {
		objs.Close()
		return &UnmetError{Why: "bypass: program ez_bypass: " + err.Error(), Code: parts.CodeOf(err)}
	}
	return nil
}

// Via is how the bypass runs, for the parts report.
func Via() string { return bpfsys.TCAttachHow() + " redirect_peer / redirect_neigh" }

// ProbeKernel loads the bypass's programs on trial, unpinned, without the
// node's conntrack checks: whether this kernel and process can run them
// at all (tcx, kfuncs, BTF fields). Nothing is attached.
func ProbeKernel() error {
	spec, err := loadBypass()
	if err != nil {
		return err
	}
	var objs bypassObjects
	if err := loadObjects(spec, nil, &objs); err != nil {
		return err
	}
	return objs.Close()
}

// Probe reports whether the bypass can run here: the node's conntrack
// settings and a trial load of its programs (nothing pinned or attached).
func Probe() parts.Status {
	b, err := Load(Config{})
	if err != nil {
		return parts.Status{Part: parts.Bypass, Code: parts.CodeOf(err), Reason: err.Error()}
	}
	b.Close()
	return parts.Status{Part: parts.Bypass, Runs: true, Via: Via()}
}

// Check validates cfg and the node's conntrack settings the bypass needs,
// and fills in the defaults (timeouts read from the node, the admit mark);
// nothing is loaded.
func Check(cfg *Config) error {
	if cfg.PinDir != "" && !filepath.IsAbs(cfg.PinDir) {
		return fmt.Errorf("bypass: pin directory %q must be an absolute path", cfg.PinDir)
	}
	if cfg.TCPTimeout < 0 || cfg.UDPTimeout < 0 || cfg.TCPTimeout > maxTimeout || cfg.UDPTimeout > maxTimeout {
		return fmt.Errorf("bypass: conntrack timeouts %v/%v out of range [0, %v]", cfg.TCPTimeout, cfg.UDPTimeout, maxTimeout)
	}
	// Bypassed TCP segments skip conntrack's window tracking: the next
	// segment on the kernel path (a FIN) is then out of its window and,
	// unless the window is liberal, INVALID, which FORWARD rules drop
	// (kube-proxy's --conntrack-tcp-be-liberal addresses the same).
	lib, err := sysctl(cfg.NetNS, "nf_conntrack_tcp_be_liberal")
	if errors.Is(err, os.ErrNotExist) {
		// nf_conntrack is a module on most distributions: not loaded, no
		// flow is confirmed, so there is nothing the bypass could admit.
		return &UnmetError{Why: fmt.Sprintf("bypass: nf_conntrack is not loaded in netns %q (no net.netfilter.nf_conntrack_tcp_be_liberal): the bypass admits only flows conntrack confirmed, and its kfuncs live in that module", cfg.NetNS)}
	}
	if err != nil {
		return err
	}
	if lib != 1 {
		return &UnmetError{Why: fmt.Sprintf("bypass: net.netfilter.nf_conntrack_tcp_be_liberal is %d in netns %q: the bypass needs 1 (conntrack does not see bypassed segments, so later ones would be out of its window and INVALID)", lib, cfg.NetNS)}
	}
	for _, t := range []struct {
		d    *time.Duration
		name string
	}{{&cfg.TCPTimeout, "nf_conntrack_tcp_timeout_established"}, {&cfg.UDPTimeout, "nf_conntrack_udp_timeout_stream"}} {
		if *t.d != 0 {
			continue
		}
		s, err := sysctl(cfg.NetNS, t.name)
		if err != nil {
			return err
		}
		*t.d = min(time.Duration(s)*time.Second, maxTimeout)
		if *t.d == 0 {
			return fmt.Errorf("bypass: net.netfilter.%s is 0 in netns %q", t.name, cfg.NetNS)
		}
	}
	if cfg.AdmitMark == 0 {
		cfg.AdmitMark = DefaultAdmitMark
	}
	if bits.OnesCount32(cfg.AdmitMark) != 2 {
		return fmt.Errorf("bypass: admit mark %#x: want exactly two bits of the conntrack mark", cfg.AdmitMark)
	}
	return nil
}

// UnmetError: the node does not meet a condition the bypass needs (a
// setting, not a fault): an agent that was not told to run the bypass runs
// without it.
type UnmetError struct {
	Why string
	// Code is its kind (parts.Codes); "": parts.CodeNodeUnsuitable.
	Code parts.Code
}

func (e *UnmetError) Error() string { return e.Why }

// PartsCode is the metrics' reason of an unmet condition.
func (e *UnmetError) PartsCode() parts.Code {
	if e.Code != "" {
		return e.Code
	}
	return parts.CodeNodeUnsuitable
}

// mapDir is where the maps are pinned in a datapath's pin directory.
func mapDir(pinDir string) string { return filepath.Join(pinDir, MapDir) }

// MapDir is the directory of the bypass's maps in a datapath's pin directory.
const MapDir = "bypass"

// Attach attaches to each pod's host-side veth (ifindexes in the bypass's
// netns; each a veth port of a bridge) the bypass at tcx ingress and its
// admission program at tcx egress, after whatever other owners attached
// there (default append: their programs run first and are never
// detached). All or nothing: on error the links this call made are closed.
func (b *Bypass) Attach(ifindexes ...int) error {
	return b.attach(false, ifindexes)
}

// AttachUplinks attaches to each uplink or overlay device (the devices
// routes to other nodes' pods leave by: an uplink in host-gw mode, the
// VXLAN device in VXLAN mode) the bypass for packets to local pods at tcx
// ingress and the admission program at tcx egress. Pod traffic is
// bypassed to other nodes only through these devices. As Attach.
func (b *Bypass) AttachUplinks(ifindexes ...int) error {
	return b.attach(true, ifindexes)
}

func (b *Bypass) attach(uplink bool, ifindexes []int) error {
	h, err := b.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	ingress, what := b.objs.EzBypass, "pod veth"
	if uplink {
		ingress, what = b.objs.EzBypassIn, "uplink"
	}
	var made []int
	err = bpfsys.InNetNS(b.netns, func() error {
		for _, ifx := range ifindexes {
			if ifx <= 0 {
				return fmt.Errorf("bypass: ifindex %d", ifx)
			}
			if a, ok := b.links[ifx]; ok {
				if a.uplink != uplink {
					return fmt.Errorf("bypass: ifindex %d is attached already, not as %s", ifx, what)
				}
				continue
			}
			dev, err := b.device(h, ifx, uplink)
			if err != nil {
				return err
			}
			// The device entry first: the programs see it from their
			// first packet on.
			if err := b.objs.EzBpDevices.Put(uint32(ifx), dev); err != nil {
				return fmt.Errorf("bypass: %s ifindex %d: %w", what, ifx, err)
			}
			var ls [2]*bpfsys.TCHook
			var pins [2]string
			for i, a := range []struct {
				prog    *ebpf.Program
				ingress bool
			}{{ingress, true}, {b.objs.EzBypassAdmit, false}} {
				l, pin, err := b.attachOne(ifx, a.prog, a.ingress)
				if err != nil {
					if ls[0] != nil {
						b.release(ls[0], true)
					}
					b.objs.EzBpDevices.Delete(uint32(ifx))
					return fmt.Errorf("bypass: %s on %s ifindex %d in netns %q: %w", dirName(a.ingress), what, ifx, b.netns, err)
				}
				ls[i], pins[i] = l, pin
			}
			b.links[ifx] = attachment{links: ls, pins: pins, uplink: uplink, dev: dev}
			made = append(made, ifx)
		}
		return nil
	})
	if err != nil {
		for _, ifx := range made {
			b.Detach(ifx)
		}
	}
	return err
}

// SetBridge records, for an attached pod veth, the bridge it is a port of
// and that bridge's MAC, if they changed since Attach: routed frames to
// other nodes are recognised by the bridge's MAC. A bridge without a MAC
// of its own takes its ports' lowest, so a new port can change it.
func (b *Bypass) SetBridge(ifindex, bridge int, mac net.HardwareAddr) error {
	a, ok := b.links[ifindex]
	if !ok || a.uplink {
		return fmt.Errorf("bypass: ifindex %d is not an attached pod veth", ifindex)
	}
	if bridge <= 0 || len(mac) != 6 {
		return fmt.Errorf("bypass: pod veth ifindex %d: bridge %d with MAC %q", ifindex, bridge, mac)
	}
	dev := a.dev
	dev.BridgeIfindex = uint32(bridge)
	copy(dev.BridgeMac[:], mac)
	if dev == a.dev {
		return nil
	}
	if err := b.objs.EzBpDevices.Put(uint32(ifindex), dev); err != nil {
		return fmt.Errorf("bypass: pod veth ifindex %d: %w", ifindex, err)
	}
	a.dev = dev
	b.links[ifindex] = a
	return b.flowsChanged()
}

// device is the ez_bp_devices entry of ifx: a pod veth must be a veth port
// of a bridge (its bridge's ifindex and MAC are recorded), an uplink must
// be neither a bridge nor a port of one.
func (b *Bypass) device(h *netlink.Handle, ifx int, uplink bool) (bypassEzBpDevice, error) {
	lk, err := h.LinkByIndex(ifx)
	if err != nil {
		return bypassEzBpDevice{}, fmt.Errorf("bypass: ifindex %d in netns %q: %w", ifx, b.netns, err)
	}
	a := lk.Attrs()
	var master netlink.Link
	if a.MasterIndex > 0 {
		if master, err = h.LinkByIndex(a.MasterIndex); err != nil {
			return bypassEzBpDevice{}, fmt.Errorf("bypass: master of %s: %w", a.Name, err)
		}
	}
	_, isBridge := lk.(*netlink.Bridge)
	_, inBridge := master.(*netlink.Bridge)
	if uplink {
		if isBridge || inBridge {
			return bypassEzBpDevice{}, fmt.Errorf("bypass: uplink %s (ifindex %d) is a bridge or a bridge port, want the device routes to other nodes leave by", a.Name, ifx)
		}
		return bypassEzBpDevice{Kind: uint32(bypassEzBpDevKindEZ_BP_DEV_UPLINK)}, nil
	}
	if _, ok := lk.(*netlink.Veth); !ok || !inBridge {
		return bypassEzBpDevice{}, fmt.Errorf("bypass: pod veth %s (ifindex %d) is a %s with master %d, want a veth port of a bridge", a.Name, ifx, lk.Type(), a.MasterIndex)
	}
	d := bypassEzBpDevice{Kind: uint32(bypassEzBpDevKindEZ_BP_DEV_POD), BridgeIfindex: uint32(a.MasterIndex)}
	copy(d.BridgeMac[:], master.Attrs().HardwareAddr)
	return d, nil
}

// Detach removes the programs from one device (a pod veth or an uplink).
func (b *Bypass) Detach(ifindex int) error {
	a, ok := b.links[ifindex]
	if !ok {
		return fmt.Errorf("bypass: not attached to ifindex %d", ifindex)
	}
	delete(b.links, ifindex)
	var err error
	for _, l := range a.links {
		err = errors.Join(err, b.release(l, true))
	}
	if derr := b.objs.EzBpDevices.Delete(uint32(ifindex)); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
		err = errors.Join(err, derr)
	}
	return errors.Join(err, b.flowsChanged())
}

// Attached lists the pod veths (ifindexes) the programs are attached to,
// sorted.
func (b *Bypass) Attached() []int { return b.attached(false) }

// Uplinks lists the uplinks (ifindexes) the programs are attached to,
// sorted.
func (b *Bypass) Uplinks() []int { return b.attached(true) }

func (b *Bypass) attached(uplink bool) []int {
	out := make([]int, 0, len(b.links))
	for ifx, a := range b.links {
		if a.uplink == uplink {
			out = append(out, ifx)
		}
	}
	slices.Sort(out)
	return out
}

// ProgramIDs are the kernel's ids of the programs, as link queries list
// them, in this order: pod veth ingress (ez_bypass), egress of pod veths and
// uplinks (ez_bypass_admit), uplink ingress (ez_bypass_in).
func (b *Bypass) ProgramIDs() ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	for _, p := range []*ebpf.Program{b.objs.EzBypass, b.objs.EzBypassAdmit, b.objs.EzBypassIn} {
		info, err := p.Info()
		if err != nil {
			return nil, err
		}
		id, ok := info.ID()
		if !ok {
			return nil, errors.New("bypass: program id unavailable")
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func epKey(ip netip.Addr) (bypassEzBpEpKey, error) {
	if !ip.IsValid() || ip.Zone() != "" {
		return bypassEzBpEpKey{}, fmt.Errorf("bypass: endpoint address %q: want an IPv4 or IPv6 address without zone", ip)
	}
	return bypassEzBpEpKey{Ip: ip.Unmap().As16()}, nil
}

// SetEndpoint adds or replaces the local pod at ip. Its ifindex must be a
// veth in the bypass's netns: bpf_redirect_peer drops packets sent to a
// device without a peer in another netns.
func (b *Bypass) SetEndpoint(ip netip.Addr, ep Endpoint) error {
	key, err := epKey(ip)
	if err != nil {
		return err
	}
	if len(ep.PodMAC) != 6 || len(ep.BridgeMAC) != 6 {
		return fmt.Errorf("bypass: endpoint %s: MACs %q and %q must be 6 bytes", ip, ep.PodMAC, ep.BridgeMAC)
	}
	h, err := b.handle()
	if err != nil {
		return err
	}
	defer h.Close()
	lk, err := h.LinkByIndex(ep.Ifindex)
	if err != nil {
		return fmt.Errorf("bypass: endpoint %s: ifindex %d in netns %q: %w", ip, ep.Ifindex, b.netns, err)
	}
	if _, ok := lk.(*netlink.Veth); !ok {
		return fmt.Errorf("bypass: endpoint %s: ifindex %d (%s) is a %s, want a pod's veth", ip, ep.Ifindex, lk.Attrs().Name, lk.Type())
	}
	// Packets from other nodes are bypassed to the pod only if the route
	// to it leads to this bridge.
	v := bypassEzBpEndpoint{Ifindex: uint32(ep.Ifindex), BridgeIfindex: uint32(lk.Attrs().MasterIndex)}
	copy(v.PodMac[:], ep.PodMAC)
	copy(v.BridgeMac[:], ep.BridgeMAC)
	if err := b.objs.EzBpEndpoints.Put(key, v); err != nil {
		return fmt.Errorf("bypass: endpoint %s: %w", ip, err)
	}
	return b.flowsChanged()
}

// flowsChanged bumps the flow cache's generation after an endpoint or
// device changed, or the node's routing (watchRouting): no packet takes
// the bypass on checks made before.
func (b *Bypass) flowsChanged() error {
	// Under the lock: two writers out of order could bring back an older
	// generation, and with it records made before the newer one.
	b.genMu.Lock()
	defer b.genMu.Unlock()
	b.gen++
	if err := b.objs.EzBpFlowsGen.Update(uint32(0), b.gen, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bypass: %s: %w", bypassMapEzBpFlowsGen, err)
	}
	return nil
}

// FlowsGeneration is the flow cache's generation: how many times its
// records were ended (an endpoint or device changed, a routing
// notification read). A test that changes the node's routing under a
// cached flow waits for it to move before it sends.
func (b *Bypass) FlowsGeneration() uint32 {
	b.genMu.Lock()
	defer b.genMu.Unlock()
	return b.gen
}

// DeleteEndpoint removes the local pod at ip.
func (b *Bypass) DeleteEndpoint(ip netip.Addr) error {
	key, err := epKey(ip)
	if err != nil {
		return err
	}
	if err := b.objs.EzBpEndpoints.Delete(key); err != nil {
		return fmt.Errorf("bypass: delete endpoint %s: %w", ip, err)
	}
	return b.flowsChanged()
}

func (b *Bypass) handle() (*netlink.Handle, error) {
	if b.netns == "" {
		return rtnl.Route()
	}
	ns, err := netns.GetFromName(b.netns)
	if err != nil {
		return nil, fmt.Errorf("bypass: netns %s: %w", b.netns, err)
	}
	defer ns.Close()
	h, err := rtnl.RouteAt(ns)
	if err != nil {
		return nil, fmt.Errorf("bypass: netlink in %s: %w", b.netns, err)
	}
	return h, nil
}

// Close releases the programs and maps. Unpinned (no PinDir): it detaches
// the programs from every device. Pinned: the links stay attached and
// pinned, for the next agent to update in place.
func (b *Bypass) Close() error {
	var errs []error
	if b.stopRouting != nil {
		b.stopRouting()
		b.stopRouting = nil
	}
	for ifx, a := range b.links {
		for _, l := range a.links {
			if err := b.release(l, false); err != nil {
				errs = append(errs, fmt.Errorf("bypass: ifindex %d: %w", ifx, err))
			}
		}
		delete(b.links, ifx)
	}
	if err := b.objs.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
