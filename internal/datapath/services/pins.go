package services

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// mapDir is where the maps are pinned in a datapath's pin directory.
func mapDir(pinDir string) string { return filepath.Join(pinDir, MapDir) }

// MapDir is the load balancer's directory in a datapath's pin directory:
// its maps, its cgroup links at links/cgroup/<cgroup id>/<program>, its
// NodePort links at links/tcx/<netns cookie>/<ifindex>/ez_svc_nodeport_ingress
// and legacy tc records at tc/<netns cookie>/<ifindex>/ez_svc_nodeport_ingress.
const MapDir = "services"

// migratePins moves the links and legacy tc records that builds before the
// family's own directory pinned beside the shortcut's (<pin dir>/links/services/<cgroup id>,
// the NodePort program's under <pin dir>/links/tcx and <pin dir>/tc) to the
// family's directory, within tx (nil: no rollback).
func migratePins(tx *bpfsys.Tx, pinDir string) error {
	fam := mapDir(pinDir)
	old := bpfsys.LinkPin("", bpfsys.KindServices) + "/"
	return bpfsys.MovePins(tx, pinDir, func(rel string) string {
		switch {
		case strings.HasPrefix(rel, old):
			return filepath.Join(fam, bpfsys.LinkPin("", bpfsys.KindCgroup, strings.TrimPrefix(rel, old)))
		case strings.HasPrefix(filepath.Base(rel), nodePortProg+"_"):
			return filepath.Join(fam, rel)
		}
		return ""
	})
}

// attachOne attaches h's program at h.at to cgroup (id: its cgroup id,
// pinned only) within tx. With pins, a link an earlier agent pinned there
// gets it in place when tx commits: translated sockets never see a moment
// without the reverse hooks. The caller closes the link on rollback.
func (lb *LB) attachOne(tx *bpfsys.Tx, cgroup string, id uint64, h hook) (link.Link, error) {
	attach := func() (link.Link, error) {
		return link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: h.at, Program: h.prog})
	}
	if lb.pinDir == "" {
		return attach()
	}
	// The pin is named by the source's name, not by the program's info:
	// the kernel keeps 15 bytes of a name (ez_svc_getpeername4 and 6 are
	// both ez_svc_getpeern), and cilium/ebpf reads the rest from BTF only
	// where BPF_BTF_GET_FD_BY_ID is allowed, which without CAP_SYS_ADMIN
	// it is not on some kernels: the two links would share one pin.
	pin := bpfsys.LinkPin(lb.pinDir, bpfsys.KindCgroup, strconv.FormatUint(id, 10), h.name)
	// A link an earlier agent pinned gets prog at the commit.
	if l, err := tx.UpdatePinnedLink(pin, h.prog); err != nil {
		return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
	} else if l != nil {
		return l, nil
	}
	l, err := attach()
	if err != nil {
		return nil, err
	}
	if err := tx.PinLink(l, pin); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Prune unpins the links pinned for cgroups this LB has not attached (an
// earlier agent's cgroups no longer managed, or removed).
func (lb *LB) Prune() (pruned []uint64, err error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.pinDir == "" || lb.closed {
		return nil, nil
	}
	base := bpfsys.LinkPin(lb.pinDir, bpfsys.KindCgroup)
	entries, err := os.ReadDir(base)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	mine := map[uint64]bool{}
	for _, id := range lb.cgIDs {
		mine[id] = true
	}
	var errs []error
	for _, e := range entries {
		id, perr := strconv.ParseUint(e.Name(), 10, 64)
		if perr != nil || mine[id] {
			continue
		}
		if err := unpinDir(filepath.Join(base, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		pruned = append(pruned, id)
	}
	return pruned, errors.Join(errs...)
}

// unpinDir unpins every link pinned in dir and removes it.
func unpinDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := bpfsys.UnpinLink(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return os.Remove(dir)
}

// Unpin removes a load balancer an earlier agent pinned under pinDir: its
// cgroup links (detached) and its maps. Sockets it translated keep their
// backend; getpeername and UDP replies show the backend from then on.
func Unpin(pinDir string) (cgroups int, err error) {
	if err := migratePins(nil, pinDir); err != nil {
		return 0, err
	}
	fam := mapDir(pinDir)
	base := bpfsys.LinkPin(fam, bpfsys.KindCgroup)
	entries, err := os.ReadDir(base)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	for _, e := range entries {
		if err := unpinDir(filepath.Join(base, e.Name())); err != nil {
			return cgroups, err
		}
		cgroups++
	}
	if err := unpinNodePorts(fam); err != nil {
		return cgroups, err
	}
	if err := os.RemoveAll(fam); err != nil {
		return cgroups, fmt.Errorf("services: remove %s: %w", fam, err)
	}
	return cgroups, nil
}

// pinnedFrontend is a frontend as the maps hold it: its ez_svc value, and
// for a NodePort whether it is Local.
type pinnedFrontend struct {
	f     Frontend
	v     servicesEzSvc
	local bool
}

// readPinned reads the frontends (ClusterIP and NodePort) and the backends
// by id from the load balancer's maps.
func readPinned(frontends, nodeports, backends *ebpf.Map) ([]pinnedFrontend, map[uint32]Backend, error) {
	var fes []pinnedFrontend
	var key servicesEzSvcKey
	var val servicesEzSvc
	it := frontends.Iterate()
	for it.Next(&key, &val) {
		f := Frontend{Addr: netip.AddrFrom16(key.Addr).Unmap(), Port: key.Port, Proto: Proto(key.Proto)}
		fes = append(fes, pinnedFrontend{f: f, v: val})
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("services: read pinned frontends: %w", err)
	}
	var nk servicesEzSvcNpKey
	var nv servicesEzSvcNp
	nit := nodeports.Iterate()
	for nit.Next(&nk, &nv) {
		a := netip.IPv4Unspecified()
		if nk.Family == 6 {
			a = netip.IPv6Unspecified()
		}
		fes = append(fes, pinnedFrontend{f: Frontend{Addr: a, Port: nk.Port, Proto: Proto(nk.Proto), NodePort: true}, v: nv.Svc,
			local: nv.Flags&uint32(servicesEzSvcNpFlagEZ_SVC_NP_LOCAL) != 0})
	}
	if err := nit.Err(); err != nil {
		return nil, nil, fmt.Errorf("services: read pinned NodePorts: %w", err)
	}
	var beID uint32
	var be servicesEzSvcBackend
	bes := map[uint32]Backend{}
	bit := backends.Iterate()
	for bit.Next(&beID, &be) {
		bes[beID] = netip.AddrPortFrom(netip.AddrFrom16(be.Addr).Unmap(), be.Port)
	}
	if err := bit.Err(); err != nil {
		return nil, nil, fmt.Errorf("services: read pinned backends: %w", err)
	}
	return fes, bes, nil
}

// restore rebuilds the LB's view (frontends, their slots, backends and
// their references, free ids) from pinned maps an earlier agent wrote, and
// deletes what an interrupted write left: slots beyond a frontend's count,
// members that are not in its slots, backends nothing references.
func (lb *LB) restore() error {
	used := map[uint32]bool{}
	fes, bes, err := readPinned(lb.objs.EzSvcFrontends, lb.objs.EzSvcNodeports, lb.objs.EzSvcBackends)
	if err != nil {
		return err
	}
	for _, e := range fes {
		st := &frontendState{id: e.v.Id, affinity: e.v.Affinity}
		for i := uint32(0); i < e.v.Count; i++ {
			var id uint32
			if err := lb.objs.EzSvcSlots.Lookup(servicesEzSvcSlotKey{Id: st.id, Slot: i}, &id); err != nil {
				return fmt.Errorf("services: pinned frontend %s: slot %d: %w", e.f, i, err)
			}
			b, ok := bes[id]
			if !ok {
				return fmt.Errorf("services: pinned frontend %s: slot %d: backend %d missing", e.f, i, id)
			}
			st.slots = append(st.slots, id)
			if s, ok := lb.backends[b]; ok {
				s.refs++
			} else {
				lb.backends[b] = &backendState{id: id, refs: 1}
				lb.byID[id] = b
			}
		}
		lb.frontends[e.f] = st
		used[st.id] = true
		lb.nextSvc = max(lb.nextSvc, st.id)
	}
	// What an interrupted write left behind.
	byFID := map[uint32][]uint32{}
	for _, st := range lb.frontends {
		byFID[st.id] = st.slots
	}
	var sk servicesEzSvcSlotKey
	var sv uint32
	var staleSlots []servicesEzSvcSlotKey
	for sit := lb.objs.EzSvcSlots.Iterate(); sit.Next(&sk, &sv); {
		if !used[sk.Id] || sk.Slot >= uint32(len(byFID[sk.Id])) {
			staleSlots = append(staleSlots, sk)
		}
	}
	for _, k := range staleSlots {
		lb.objs.EzSvcSlots.Delete(k)
	}
	var mk servicesEzSvcMemberKey
	var mv uint32
	var staleMembers []servicesEzSvcMemberKey
	for mit := lb.objs.EzSvcMembers.Iterate(); mit.Next(&mk, &mv); {
		if !slices.Contains(byFID[mk.Id], mk.Backend) {
			staleMembers = append(staleMembers, mk)
		}
	}
	for _, k := range staleMembers {
		lb.objs.EzSvcMembers.Delete(k)
	}
	for _, st := range lb.frontends {
		for _, id := range st.slots {
			if err := lb.objs.EzSvcMembers.Put(servicesEzSvcMemberKey{Id: st.id, Backend: id}, uint32(0)); err != nil {
				return fmt.Errorf("services: restore member: %w", err)
			}
		}
	}
	for id, b := range bes {
		if _, ok := lb.backends[b]; !ok || lb.backends[b].id != id {
			lb.objs.EzSvcBackends.Delete(id)
		}
		lb.nextBe = max(lb.nextBe, id)
	}
	for id := uint32(1); id <= lb.nextSvc; id++ {
		if !used[id] {
			lb.freeSvc = append(lb.freeSvc, id)
		}
	}
	for id := uint32(1); id <= lb.nextBe; id++ {
		if _, ok := lb.byID[id]; !ok {
			lb.freeBe = append(lb.freeBe, id)
		}
	}
	return nil
}

// List lists the frontends written, sorted.
func (lb *LB) List() []Frontend {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := make([]Frontend, 0, len(lb.frontends))
	for f := range lb.frontends {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b Frontend) int {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return int(a.Proto) - int(b.Proto)
	})
	return out
}

// PinnedState is what `eztunnel status` shows of a pinned load balancer.
type PinnedState struct {
	Frontends int      `json:"frontends"` // ClusterIP:port:protocol
	NodePorts int      `json:"nodeports"` // port:protocol:family
	Backends  int      `json:"backends"`  // distinct addresses and ports
	Cgroups   int      `json:"cgroups"`   // cgroups its hooks are attached to
	Proxied   int      `json:"proxied"`   // pods left to their proxy
	Counters  Counters `json:"counters"`
}

// ReadPinned reads the load balancer pinned under pinDir; nil and no error
// when there is none.
func ReadPinned(pinDir string) (*PinnedState, error) {
	dir := mapDir(pinDir)
	if !bpfsys.Exists(dir) {
		return nil, nil
	}
	count := func(name string) (int, error) {
		m, err := bpfsys.OpenPinnedMap(dir, name)
		if err != nil {
			return 0, fmt.Errorf("services: %w", err)
		}
		defer m.Close()
		n := 0
		k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(&k, &v) {
			n++
		}
		return n, it.Err()
	}
	st := &PinnedState{Counters: Counters{}}
	var err error
	if st.Frontends, err = count(servicesMapEzSvcFrontends); err != nil {
		return nil, err
	}
	if st.NodePorts, err = count(servicesMapEzSvcNodeports); err != nil {
		return nil, err
	}
	if st.Backends, err = count(servicesMapEzSvcBackends); err != nil {
		return nil, err
	}
	if bpfsys.Exists(filepath.Join(dir, servicesMapEzSvcProxied)) { // pinned by an agent that has it
		if st.Proxied, err = count(servicesMapEzSvcProxied); err != nil {
			return nil, err
		}
	}
	if entries, err := os.ReadDir(bpfsys.LinkPin(dir, bpfsys.KindCgroup)); err == nil {
		st.Cgroups = len(entries)
	}
	ctrs, err := ebpf.LoadPinnedMap(filepath.Join(dir, servicesMapEzSvcCounters), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("services: open pinned counters: %w", err)
	}
	defer ctrs.Close()
	if err := counters.ReadInto(ctrs, st.Counters); err != nil {
		return nil, fmt.Errorf("services: %w", err)
	}
	return st, nil
}

// PinnedFrontend is one frontend of a pinned load balancer and the
// backends its slots hold, as `eztunnel services` lists them.
type PinnedFrontend struct {
	Frontend string   `json:"frontend"` // addr:port/proto, NodePorts as *:port/proto (family 4 or 6)
	NodePort bool     `json:"nodePort,omitempty"`
	Local    bool     `json:"local,omitempty"`    // NodePort, externalTrafficPolicy Local: client source kept
	Affinity uint32   `json:"affinity,omitempty"` // sessionAffinity ClientIP timeout, seconds
	Backends []string `json:"backends"`           // sorted
}

// ReadPinnedFrontends lists the frontends of the load balancer pinned
// under pinDir with their backends, sorted; nil and no error when none is
// pinned. It reads the maps only: an agent may run meanwhile, so a
// frontend being rewritten may show a slot it is about to drop.
func ReadPinnedFrontends(pinDir string) ([]PinnedFrontend, error) {
	dir := mapDir(pinDir)
	if !bpfsys.Exists(dir) {
		return nil, nil
	}
	open := func(name string) (*ebpf.Map, error) {
		m, err := bpfsys.OpenPinnedMap(dir, name)
		if err != nil {
			return nil, fmt.Errorf("services: %w", err)
		}
		return m, nil
	}
	var maps [4]*ebpf.Map
	for i, name := range []string{servicesMapEzSvcFrontends, servicesMapEzSvcNodeports, servicesMapEzSvcBackends, servicesMapEzSvcSlots} {
		m, err := open(name)
		if err != nil {
			return nil, err // the ones opened close on return
		}
		defer m.Close()
		maps[i] = m
	}
	fes, bes, err := readPinned(maps[0], maps[1], maps[2])
	if err != nil {
		return nil, err
	}
	out := make([]PinnedFrontend, 0, len(fes))
	for _, e := range fes {
		pf := PinnedFrontend{NodePort: e.f.NodePort, Local: e.local, Affinity: e.v.Affinity, Backends: []string{}}
		if e.f.NodePort {
			family := 4
			if e.f.Addr.Is6() {
				family = 6
			}
			pf.Frontend = fmt.Sprintf("*:%d/%s (IPv%d)", e.f.Port, e.f.Proto, family)
		} else {
			pf.Frontend = netip.AddrPortFrom(e.f.Addr, e.f.Port).String() + "/" + e.f.Proto.String()
		}
		for i := uint32(0); i < e.v.Count; i++ {
			var id uint32
			if maps[3].Lookup(servicesEzSvcSlotKey{Id: e.v.Id, Slot: i}, &id) != nil {
				continue
			}
			if b, ok := bes[id]; ok {
				pf.Backends = append(pf.Backends, b.String())
			}
		}
		slices.Sort(pf.Backends)
		out = append(out, pf)
	}
	slices.SortFunc(out, func(a, b PinnedFrontend) int {
		if a.NodePort != b.NodePort {
			if a.NodePort {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Frontend, b.Frontend)
	})
	return out, nil
}
