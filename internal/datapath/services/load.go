package services

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// Proto is a frontend's transport protocol (IPPROTO_TCP, IPPROTO_UDP).
type Proto uint8

const (
	TCP Proto = 6
	UDP Proto = 17
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// Frontend is what a socket connects or sends to: a ClusterIP, port and
// protocol. A NodePort frontend is a port of the node's addresses (those
// given to SetNodeAddrs, reached through the devices given to
// AttachNodePort); its Addr is the unspecified address of its family
// (0.0.0.0 or ::).
type Frontend struct {
	Addr     netip.Addr
	Port     uint16
	Proto    Proto
	NodePort bool
}

func (f Frontend) String() string {
	if f.NodePort {
		return fmt.Sprintf("NodePort %s/%s", netip.AddrPortFrom(f.Addr, f.Port), f.Proto)
	}
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(f.Addr, f.Port), f.Proto)
}

// Backend is where a frontend's sockets go.
type Backend = netip.AddrPort

// Target is what a frontend translates to.
type Target struct {
	Backends []Backend // order does not matter, duplicates are ignored; none: connects refused
	// Listed are backends the source still lists for the frontend though
	// it does not choose them (not ready, terminating). A backend leaving
	// Backends has its connected UDP sockets destroyed (kube-proxy deletes
	// the conntrack entries of such UDP flows) and, unless it is Listed, its
	// TCP sockets too: a gone backend leaves no connection stuck on it,
	// while a not-ready or terminating one keeps its connections, as with
	// kube-proxy.
	Listed []Backend
	// KeepSource (NodePort frontends): externalTrafficPolicy Local, the
	// client's address reaches the backend (Backends are the node's own);
	// false: the flow is masqueraded to the node address the client used.
	KeepSource bool
	// Affinity is sessionAffinity ClientIP's timeout: a client (network
	// namespace) keeps its backend while it comes back within it (whole
	// seconds, rounded up); 0: a random backend per socket.
	Affinity time.Duration
	// External: the frontend is a Service's ExternalIP or load-balancer IP,
	// addresses a namespace's owner chooses; a ClusterIP at the same
	// address takes the frontend over (svcsync.Table). Not written.
	External bool
}

// MaxAffinity is the longest Affinity (as the Kubernetes API allows).
const MaxAffinity = 86400 * time.Second

// Config sizes the maps; zero values take the defaults.
type Config struct {
	// MaxFrontends bounds ClusterIP and NodePort frontends together (they
	// share ids): default 65536, e.g. 10,000 dual-stack Services with
	// 2767 dual-stack NodePorts take 25,534.
	MaxFrontends uint32
	MaxBackends  uint32 // distinct backend addresses, default 65536
	MaxSlots     uint32 // backends of all frontends together, default 131072
	// PinDir is the datapath's pin directory (<pin path>/<schema>): the
	// maps are pinned in PinDir/services and the cgroup links under
	// PinDir/services/links/cgroup/<cgroup id>/<program>, so translated sockets
	// keep their reverse translation (sk_storage) and the frontends stay
	// while no agent runs. A later Load with the same PinDir reuses the
	// maps and rebuilds its state from them; Attach updates the pinned
	// links in place. "": nothing is pinned and Close detaches everything.
	PinDir string
}

// LB is the loaded load balancer: programs, maps, cgroup links, and the
// ids it gave frontends and backends.
type LB struct {
	mu     sync.Mutex
	pinDir string // the family's directory <Config.PinDir>/services (pins.go); "": nothing pinned
	objs   servicesObjects
	links  map[string][]link.Link // by cgroup path
	cgIDs  map[string]uint64      // by cgroup path (pinned only)
	netns  func() ([]string, error)
	// This process's NodePort tcx links, by ifindex.
	npLinks map[int]link.Link
	// The NodePort legacy tc filters this process attached (kernels
	// without tcx), by ifindex: their records.
	npFilters map[int]string

	// Pods left to their proxy, by cgroup id (proxied.go), and the span
	// of levels an earlier agent pinned (until the first SetProxied).
	proxied      map[uint64]proxiedState
	restoredSpan servicesEzSvcProxySpan

	frontends map[Frontend]*frontendState
	backends  map[Backend]*backendState
	byID      map[uint32]Backend
	freeSvc   []uint32
	nextSvc   uint32
	freeBe    []uint32
	nextBe    uint32
	closed    bool
	parts     parts.Report // which parts loaded (load)
}

type frontendState struct {
	id       uint32
	slots    []uint32 // backend ids, in slot order
	affinity uint32   // seconds
}

type backendState struct {
	id   uint32
	refs int
}

// Load loads the programs and creates the maps; nothing is attached yet.
func Load(cfg Config) (_ *LB, err error) {
	spec, err := loadServices()
	if err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	for _, m := range []struct {
		spec *ebpf.MapSpec
		n    uint32
	}{{spec.Maps[servicesMapEzSvcFrontends], cfg.MaxFrontends}, {spec.Maps[servicesMapEzSvcBackends], cfg.MaxBackends},
		{spec.Maps[servicesMapEzSvcSlots], cfg.MaxSlots}, {spec.Maps[servicesMapEzSvcMembers], cfg.MaxSlots}} {
		if m.n != 0 {
			m.spec.MaxEntries = m.n
		}
	}
	lb := &LB{links: map[string][]link.Link{}, cgIDs: map[string]uint64{}, frontends: map[Frontend]*frontendState{},
		backends: map[Backend]*backendState{}, byID: map[uint32]Backend{}, proxied: map[uint64]proxiedState{}}
	var opts *ebpf.CollectionOptions
	if cfg.PinDir != "" {
		lb.pinDir = mapDir(cfg.PinDir)
		if !filepath.IsAbs(cfg.PinDir) {
			return nil, fmt.Errorf("services: pin directory %q must be an absolute path", cfg.PinDir)
		}
		if err := bpfsys.EnsureDir(mapDir(cfg.PinDir)); err != nil {
			return nil, fmt.Errorf("services: %w", err)
		}
		for _, m := range spec.Maps {
			if strings.HasPrefix(m.Name, "ez_svc_") {
				m.Pinning = ebpf.PinByName
			}
		}
		opts = &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapDir(cfg.PinDir)}}
		// A build with more counters loads over the smaller pinned ones (an
		// upgrade in place).
		if err := bpfsys.GrowPinnedCounters(mapDir(cfg.PinDir), spec, servicesMapEzSvcCounters); err != nil {
			return nil, fmt.Errorf("services: %w", err)
		}
	}
	if err := lb.load(spec, opts); err != nil {
		return nil, err
	}
	if cfg.PinDir != "" {
		if err := lb.restore(); err != nil {
			lb.objs.Close()
			return nil, err
		}
		if err := lb.restoreProxied(); err != nil {
			lb.objs.Close()
			return nil, err
		}
	}
	return lb, nil
}

// programGroups are the load balancer's programs by part: ClusterIP at the
// socket is required; NodePort (tcx, or legacy tc) and the destruction of a removed
// backend's sockets (bpf_sock_destroy from iter/tcp and iter/udp, Linux 6.5)
// turn off alone.
func programGroups() []bpfsys.Group {
	return []bpfsys.Group{
		{Part: parts.ServicesLB, Required: true, Progs: []string{servicesProgEzSvcConnect4, servicesProgEzSvcConnect6,
			servicesProgEzSvcSendmsg4, servicesProgEzSvcSendmsg6, servicesProgEzSvcRecvmsg4, servicesProgEzSvcRecvmsg6,
			servicesProgEzSvcGetpeername4, servicesProgEzSvcGetpeername6, servicesProgEzSvcOrigConnect,
			servicesProgEzSvcOrigRelease, servicesProgEzSvcGetsockopt}, Via: "cgroup connect/sendmsg/recvmsg/getpeername"},
		{Part: parts.NodePort, Progs: []string{servicesProgEzSvcNodeport}, Via: bpfsys.TCAttachHow() + " ingress + conntrack NAT kfuncs", Attach: bpfsys.TCAttachable},
		{Part: parts.SocketDestroy, Progs: []string{servicesProgEzSvcDestroyTcp, servicesProgEzSvcDestroyUdp}, Via: "bpf_sock_destroy from iter/tcp, iter/udp",
			// Without the kfunc (Linux 6.5): the iterators only find the
			// sockets, sock_diag destroys them (destroy.go).
			Fallback: &bpfsys.Group{Progs: []string{servicesProgEzSvcGoneTcp, servicesProgEzSvcGoneUdp},
				Via: "iter/tcp, iter/udp find the sockets, sock_diag SOCK_DESTROY destroys them"}},
	}
}

// load loads the maps, then each part's programs on its own.
func (lb *LB) load(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) error {
	ps, err := bpfsys.LoadMaps(spec, opts)
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return fmt.Errorf("services: pinned maps in %s do not match this build or these sizes; run `eztunnel uninstall` first: %w", lb.pinDir, err)
		}
		return fmt.Errorf("services: load maps: %w", err)
	}
	defer ps.Close()
	loaded, err := ps.LoadGroups(programGroups(), &lb.parts)
	if err != nil {
		return fmt.Errorf("services: %w", err)
	}
	if err := ps.Coll.Assign(&lb.objs.servicesMaps); err != nil {
		bpfsys.CloseAll(loaded)
		return fmt.Errorf("services: %w", err)
	}
	bpfsys.AssignPrograms(loaded, &lb.objs.servicesPrograms)
	return nil
}

// Probe reports which of the load balancer's parts can run here, by a trial
// load (nothing pinned or attached).
func Probe() parts.Report {
	lb, err := Load(Config{})
	if err != nil {
		var rep parts.Report
		for _, p := range []parts.Name{parts.ServicesLB, parts.NodePort, parts.SocketDestroy} {
			rep.OffErr(p, err)
		}
		return rep
	}
	defer lb.Close()
	return lb.Parts()
}

// Parts reports which of the load balancer's parts loaded, and why others did not.
func (lb *LB) Parts() parts.Report { return lb.parts }

// hooks are the programs attached to each cgroup.
func (lb *LB) hooks() []hook {
	o := &lb.objs
	return []hook{
		// Reverse translation first: a socket translated once must always
		// be shown its frontend, even while the forward hooks attach.
		{servicesProgEzSvcGetpeername4, o.EzSvcGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{servicesProgEzSvcGetpeername6, o.EzSvcGetpeername6, ebpf.AttachCgroupInet6GetPeername},
		{servicesProgEzSvcRecvmsg4, o.EzSvcRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{servicesProgEzSvcRecvmsg6, o.EzSvcRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		// SO_ORIGINAL_DST for a sidecar: answered, recorded at the SYN,
		// forgotten at close (bpf/services/origdst.h).
		{servicesProgEzSvcGetsockopt, o.EzSvcGetsockopt, ebpf.AttachCGroupGetsockopt},
		{servicesProgEzSvcOrigRelease, o.EzSvcOrigRelease, ebpf.AttachCgroupInetSockRelease},
		{servicesProgEzSvcOrigConnect, o.EzSvcOrigConnect, ebpf.AttachCGroupSockOps},
		{servicesProgEzSvcConnect4, o.EzSvcConnect4, ebpf.AttachCGroupInet4Connect},
		{servicesProgEzSvcConnect6, o.EzSvcConnect6, ebpf.AttachCGroupInet6Connect},
		{servicesProgEzSvcSendmsg4, o.EzSvcSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{servicesProgEzSvcSendmsg6, o.EzSvcSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
	}
}

// hook is a cgroup program: its name (the source's, which names its pin),
// the program and where it attaches.
type hook struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
}

// Attach attaches every program to a cgroup v2 directory (its processes and
// those of its descendants), after other owners' programs there. All or
// nothing: on error what this call attached or pinned is undone.
func (lb *LB) Attach(cgroup string) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return bpfsys.RunTx(func(tx *bpfsys.Tx) error { return lb.attach(tx, cgroup) })
}

// attach is Attach within tx (lb.mu held, or lb not shared yet): links an
// earlier agent pinned for cgroup get this load's programs in place, new
// ones are pinned; rollback undoes both and closes this call's links.
func (lb *LB) attach(tx *bpfsys.Tx, cgroup string) error {
	if lb.closed {
		return errClosed
	}
	if _, ok := lb.links[cgroup]; ok {
		return nil
	}
	if err := cgroupv2.Validate(cgroup); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	var id uint64
	if lb.pinDir != "" {
		var err error
		if id, err = cgroupv2.ID(cgroup); err != nil {
			return fmt.Errorf("services: %w", err)
		}
	}
	var ls []link.Link
	// Registered first, so it runs last: after the links' own undo steps.
	tx.OnRollback(func() error {
		for _, l := range ls {
			l.Close()
		}
		delete(lb.links, cgroup)
		delete(lb.cgIDs, cgroup)
		return nil
	})
	for _, h := range lb.hooks() {
		l, err := lb.attachOne(tx, cgroup, id, h)
		if err != nil {
			return fmt.Errorf("services: attach %s to cgroup %s: %w", h.at, cgroup, err)
		}
		ls = append(ls, l)
	}
	lb.links[cgroup] = ls
	if lb.pinDir != "" {
		lb.cgIDs[cgroup] = id
	}
	return nil
}

// Name names the family (datapath.Family).
func (lb *LB) Name() string { return "services" }

// Install gives the links and legacy tc filters an earlier agent pinned
// under the pin directory (cgroup hooks, NodePort devices in every network
// namespace) this load's programs in place, then attaches to cgroups, all
// within tx (datapath.Family). NodePort devices and frontends converge
// afterwards (SyncNodePortDevices, SetFrontend, Prune).
func (lb *LB) Install(tx *bpfsys.Tx, cgroups []string) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.pinDir != "" {
		progs := map[string]*ebpf.Program{}
		for _, h := range lb.hooks() {
			progs[h.name] = h.prog
		}
		if lb.objs.EzSvcNodeport != nil {
			progs[servicesProgEzSvcNodeport] = lb.objs.EzSvcNodeport
		}
		if _, err := tx.UpgradePinned(lb.pinDir, progs); err != nil {
			return fmt.Errorf("services: %w", err)
		}
	}
	for _, cg := range cgroups {
		if err := lb.attach(tx, cg); err != nil {
			return err
		}
	}
	return nil
}

// Attached lists the cgroups the programs are attached to, sorted.
func (lb *LB) Attached() []string {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := make([]string, 0, len(lb.links))
	for cg := range lb.links {
		out = append(out, cg)
	}
	slices.Sort(out)
	return out
}

// ProgramIDs are the kernel's ids of the programs (as link queries list them).
func (lb *LB) ProgramIDs() ([]ebpf.ProgramID, error) {
	var ids []ebpf.ProgramID
	for _, h := range lb.hooks() {
		info, err := h.prog.Info()
		if err != nil {
			return nil, err
		}
		id, ok := info.ID()
		if !ok {
			return nil, errors.New("services: program id unavailable")
		}
		ids = append(ids, id)
	}
	return ids, nil
}

var errClosed = errors.New("services: closed")

// Close releases the programs and maps. Unpinned: it detaches from every
// cgroup. Pinned: the links stay attached, for the next agent.
func (lb *LB) Close() error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil
	}
	lb.closed = true
	var errs []error
	for _, l := range lb.npLinks {
		errs = append(errs, l.Close()) // pinned: stays attached
	}
	lb.npLinks = nil
	// Forward translation first (reverse hooks were attached first).
	for _, ls := range lb.links {
		for i := len(ls) - 1; i >= 0; i-- {
			errs = append(errs, ls[i].Close())
		}
	}
	lb.links = nil
	errs = append(errs, lb.objs.Close())
	return errors.Join(errs...)
}

// Frontends is how many frontends are written.
func (lb *LB) Frontends() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return len(lb.frontends)
}

// BackendRefs is how many backend slots are written (all frontends).
func (lb *LB) BackendRefs() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	n := 0
	for _, f := range lb.frontends {
		n += len(f.slots)
	}
	return n
}

// nodePortKey is the ez_svc_nodeports key of a NodePort frontend.
func nodePortKey(f Frontend) (servicesEzSvcNpKey, error) {
	if !f.Addr.IsValid() || !f.Addr.IsUnspecified() {
		return servicesEzSvcNpKey{}, fmt.Errorf("services: %s: a NodePort's address is 0.0.0.0 or :: (its family)", f)
	}
	if f.Proto != TCP && f.Proto != UDP {
		return servicesEzSvcNpKey{}, fmt.Errorf("services: %s: protocol must be TCP or UDP", f)
	}
	if f.Port == 0 {
		return servicesEzSvcNpKey{}, fmt.Errorf("services: %s: port 0", f)
	}
	fam := uint8(4)
	if f.Addr.Is6() {
		fam = 6
	}
	return servicesEzSvcNpKey{Port: f.Port, Proto: uint8(f.Proto), Family: fam}, nil
}

func frontendKey(f Frontend) (servicesEzSvcKey, error) {
	if f.NodePort {
		return servicesEzSvcKey{}, fmt.Errorf("services: %s: not a ClusterIP frontend", f)
	}
	if !f.Addr.IsValid() || f.Addr.Zone() != "" || f.Addr.IsUnspecified() {
		return servicesEzSvcKey{}, fmt.Errorf("services: frontend %s: want an IPv4 or IPv6 address without zone", f)
	}
	if f.Proto != TCP && f.Proto != UDP {
		return servicesEzSvcKey{}, fmt.Errorf("services: frontend %s: protocol must be TCP or UDP", f)
	}
	if f.Port == 0 {
		return servicesEzSvcKey{}, fmt.Errorf("services: frontend %s: port 0", f)
	}
	return servicesEzSvcKey{Addr: as16(f.Addr), Port: f.Port, Proto: uint8(f.Proto)}, nil
}

// as16 is the maps' address form: IPv6, or IPv4 v4-mapped.
func as16(a netip.Addr) [16]byte {
	if a.Is4() {
		return netip.AddrFrom16(a.As16()).As16()
	}
	return a.As16()
}

// svcValue is a frontend's value: its id, backend count and affinity, and
// its backends themselves when it has at most EZ_SVC_INLINE (the programs
// then read neither the slots nor the backends map).
func (lb *LB) svcValue(id uint32, slots []uint32, affinity uint32) servicesEzSvc {
	v := servicesEzSvc{Id: id, Count: uint32(len(slots)), Affinity: affinity}
	if len(slots) <= len(v.Ids) {
		for i, bid := range slots {
			b := lb.byID[bid]
			v.Ids[i] = bid
			v.Be[i] = servicesEzSvcBackend{Addr: as16(b.Addr()), Port: b.Port()}
		}
	}
	return v
}

// SetFrontend writes f with target. Only f's entries are written;
// backends it keeps keep their slots.
func (lb *LB) SetFrontend(f Frontend, target Target) error {
	f.Addr = f.Addr.Unmap()
	var key servicesEzSvcKey
	var npKey servicesEzSvcNpKey
	var err error
	if f.NodePort {
		npKey, err = nodePortKey(f)
	} else {
		key, err = frontendKey(f)
	}
	if err != nil {
		return err
	}
	if target.Affinity < 0 || target.Affinity > MaxAffinity {
		return fmt.Errorf("services: frontend %s: session affinity %v out of range [0, %v]", f, target.Affinity, MaxAffinity)
	}
	affinity := uint32((target.Affinity + time.Second - 1) / time.Second)
	backends := target.Backends
	want := map[Backend]bool{}
	for _, b := range backends {
		if !b.IsValid() || b.Port() == 0 || b.Addr().Zone() != "" || b.Addr().IsUnspecified() {
			return fmt.Errorf("services: frontend %s: backend %s: want address:port, no zone, port not 0", f, b)
		}
		if b.Addr().Unmap().Is4() != f.Addr.Unmap().Is4() {
			return fmt.Errorf("services: frontend %s: backend %s is of the other IP family", f, b)
		}
		want[netip.AddrPortFrom(b.Addr().Unmap(), b.Port())] = true
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return errClosed
	}
	st, existed := lb.frontends[f]
	if !existed {
		id, err := lb.allocSvc()
		if err != nil {
			return fmt.Errorf("services: frontend %s: %w", f, err)
		}
		st = &frontendState{id: id}
	}
	// New slot order: kept backends stay where they are, a removed one's
	// slot takes the last one, new ones are appended.
	old := slices.Clone(st.slots)
	slots := slices.Clone(st.slots)
	var removed []Backend
	for i := 0; i < len(slots); {
		b := lb.byID[slots[i]]
		if want[b] {
			delete(want, b)
			i++
			continue
		}
		removed = append(removed, b)
		slots[i] = slots[len(slots)-1]
		slots = slots[:len(slots)-1]
	}
	var added []Backend
	for b := range want {
		added = append(added, b)
	}
	slices.SortFunc(added, func(a, b Backend) int { return a.Compare(b) })
	for _, b := range added {
		id, err := lb.refBackend(b)
		if err != nil {
			return fmt.Errorf("services: frontend %s: %w", f, err)
		}
		slots = append(slots, id)
		mk := servicesEzSvcMemberKey{Id: st.id, Backend: id}
		if err := lb.objs.EzSvcMembers.Put(mk, uint32(0)); err != nil {
			return fmt.Errorf("services: frontend %s: member %s: %w", f, b, err)
		}
	}
	// Slots first, then the count, then slots beyond it: a reader sees
	// either count and finds every slot below it.
	for i, id := range slots {
		if i < len(old) && old[i] == id {
			continue
		}
		if err := lb.objs.EzSvcSlots.Put(servicesEzSvcSlotKey{Id: st.id, Slot: uint32(i)}, id); err != nil {
			return fmt.Errorf("services: frontend %s: slot %d: %w", f, i, err)
		}
	}
	if f.NodePort {
		v := servicesEzSvcNp{Svc: lb.svcValue(st.id, slots, 0)}
		if target.KeepSource {
			v.Flags = uint32(servicesEzSvcNpFlagEZ_SVC_NP_LOCAL)
		}
		err = lb.objs.EzSvcNodeports.Put(npKey, v)
	} else {
		err = lb.objs.EzSvcFrontends.Put(key, lb.svcValue(st.id, slots, affinity))
	}
	if err != nil {
		return fmt.Errorf("services: frontend %s: %w", f, err)
	}
	lb.frontends[f] = st
	st.slots, st.affinity = slots, affinity
	for i := len(slots); i < len(old); i++ {
		lb.objs.EzSvcSlots.Delete(servicesEzSvcSlotKey{Id: st.id, Slot: uint32(i)})
	}
	var gs []gone
	for _, b := range removed {
		id := lb.backends[b].id
		lb.objs.EzSvcMembers.Delete(servicesEzSvcMemberKey{Id: st.id, Backend: id})
		lb.unrefBackend(b)
		g := gone{id: st.id, b: b, flags: servicesEzSvcGoneFlagEZ_SVC_GONE_UDP}
		if !slices.ContainsFunc(target.Listed, func(l Backend) bool { return netip.AddrPortFrom(l.Addr().Unmap(), l.Port()) == b }) {
			g.flags |= servicesEzSvcGoneFlagEZ_SVC_GONE_TCP
		}
		gs = append(gs, g)
	}
	if !f.NodePort { // no socket is translated to a NodePort's backends
		lb.destroy(gs)
	} else if f.Proto == UDP && len(removed) > 0 {
		flushNodePortUDP(f, removed)
	}
	return nil
}

// DeleteFrontend removes f and its slots; connects to it are no longer
// translated. Deleting an unknown frontend is not an error.
func (lb *LB) DeleteFrontend(f Frontend) error {
	f.Addr = f.Addr.Unmap()
	var del func() error
	if f.NodePort {
		k, err := nodePortKey(f)
		if err != nil {
			return err
		}
		del = func() error { return lb.objs.EzSvcNodeports.Delete(k) }
	} else {
		k, err := frontendKey(f)
		if err != nil {
			return err
		}
		del = func() error { return lb.objs.EzSvcFrontends.Delete(k) }
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return errClosed
	}
	st, ok := lb.frontends[f]
	if !ok {
		return nil
	}
	if err := del(); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("services: delete frontend %s: %w", f, err)
	}
	delete(lb.frontends, f)
	// Connected UDP sockets of the frontend go, as kube-proxy deletes the
	// conntrack entries of a deleted Service's UDP flows; TCP connections
	// keep their (live) backends.
	var gs []gone
	for i, id := range st.slots {
		lb.objs.EzSvcSlots.Delete(servicesEzSvcSlotKey{Id: st.id, Slot: uint32(i)})
		lb.objs.EzSvcMembers.Delete(servicesEzSvcMemberKey{Id: st.id, Backend: id})
		if f.Proto == UDP && !f.NodePort {
			gs = append(gs, gone{id: st.id, b: lb.byID[id], flags: servicesEzSvcGoneFlagEZ_SVC_GONE_UDP})
		}
		lb.unrefBackend(lb.byID[id])
	}
	lb.destroy(gs)
	if f.NodePort && f.Proto == UDP {
		flushNodePortUDP(f, nil)
	}
	lb.freeSvc = append(lb.freeSvc, st.id)
	return nil
}

func (lb *LB) allocSvc() (uint32, error) {
	if n := len(lb.freeSvc); n > 0 {
		id := lb.freeSvc[n-1]
		lb.freeSvc = lb.freeSvc[:n-1]
		return id, nil
	}
	if lb.nextSvc >= lb.objs.EzSvcFrontends.MaxEntries() {
		return 0, fmt.Errorf("%d frontends: the map is full", lb.nextSvc)
	}
	lb.nextSvc++ // ids start at 1: 0 marks an unused socket entry
	return lb.nextSvc, nil
}

// refBackend returns b's id, writing it on its first reference.
func (lb *LB) refBackend(b Backend) (uint32, error) {
	if s, ok := lb.backends[b]; ok {
		s.refs++
		return s.id, nil
	}
	var id uint32
	if n := len(lb.freeBe); n > 0 {
		id = lb.freeBe[n-1]
		lb.freeBe = lb.freeBe[:n-1]
	} else {
		if lb.nextBe >= lb.objs.EzSvcBackends.MaxEntries() {
			return 0, fmt.Errorf("backend %s: %d backends, the map is full", b, lb.nextBe)
		}
		lb.nextBe++
		id = lb.nextBe
	}
	v := servicesEzSvcBackend{Addr: as16(b.Addr()), Port: b.Port()}
	if err := lb.objs.EzSvcBackends.Put(id, v); err != nil {
		lb.freeBe = append(lb.freeBe, id)
		return 0, fmt.Errorf("backend %s: %w", b, err)
	}
	lb.backends[b] = &backendState{id: id, refs: 1}
	lb.byID[id] = b
	return id, nil
}

func (lb *LB) unrefBackend(b Backend) {
	s, ok := lb.backends[b]
	if !ok {
		return
	}
	if s.refs--; s.refs > 0 {
		return
	}
	lb.objs.EzSvcBackends.Delete(s.id)
	delete(lb.backends, b)
	delete(lb.byID, s.id)
	lb.freeBe = append(lb.freeBe, s.id)
}

// Counters are the per-CPU counters summed over CPUs, by name.
type Counters = bpfsys.Counters

// counters names enum values (external names: metrics, JSON);
// TestCounterNamesComplete checks every value has one.
var counters = bpfsys.CounterSet[servicesEzSvcCounter]{Max: servicesEzSvcCounterEZ_SVC_C_MAX, Names: map[servicesEzSvcCounter]string{
	servicesEzSvcCounterEZ_SVC_C_TCP_CONNECT:   "tcp_connect",
	servicesEzSvcCounterEZ_SVC_C_UDP_CONNECT:   "udp_connect",
	servicesEzSvcCounterEZ_SVC_C_UDP_SEND:      "udp_send",
	servicesEzSvcCounterEZ_SVC_C_UDP_REPICK:    "udp_repick",
	servicesEzSvcCounterEZ_SVC_C_RECV_REVERSED: "recv_reversed",
	servicesEzSvcCounterEZ_SVC_C_PEER_REVERSED: "peer_reversed",
	servicesEzSvcCounterEZ_SVC_C_NO_BACKEND:    "no_backend",
	servicesEzSvcCounterEZ_SVC_C_BACKEND_MISS:  "backend_miss",
	servicesEzSvcCounterEZ_SVC_C_NO_STORAGE:    "no_storage",
	servicesEzSvcCounterEZ_SVC_C_AFFINITY_HIT:  "affinity_hit",
	servicesEzSvcCounterEZ_SVC_C_DESTROYED_TCP: "destroyed_tcp",
	servicesEzSvcCounterEZ_SVC_C_DESTROYED_UDP: "destroyed_udp",
	servicesEzSvcCounterEZ_SVC_C_ORIG_DST:      "orig_dst",
	servicesEzSvcCounterEZ_SVC_C_ORIG_FULL:     "orig_full",
	servicesEzSvcCounterEZ_SVC_C_NP_NEW:        "nodeport_new",
	servicesEzSvcCounterEZ_SVC_C_NP_NO_BACKEND: "nodeport_no_backend",
	servicesEzSvcCounterEZ_SVC_C_NP_NOT_NEW:    "nodeport_not_new",
	servicesEzSvcCounterEZ_SVC_C_NP_CT_FAILED:  "nodeport_ct_failed",
	servicesEzSvcCounterEZ_SVC_C_NP_REOPENED:   "nodeport_reopened",
	servicesEzSvcCounterEZ_SVC_C_LEFT_TO_PROXY: "left_to_proxy",
}}

// CounterNames lists every counter name in enum order.
func CounterNames() []string { return counters.List() }

// Counters reads the counters.
func (lb *LB) Counters() (Counters, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return nil, errClosed
	}
	c, err := counters.Read(lb.objs.EzSvcCounters)
	if err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	return c, nil
}
