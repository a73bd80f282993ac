package services

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
)

// Proxied is a pod left to its proxy: TCP connects to a frontend made by
// processes in Cgroup (the pod's cgroup) or below it are not translated, so
// the pod's own interception (a mesh's iptables REDIRECT) sees the ClusterIP
// and its proxy learns it from conntrack (SO_ORIGINAL_DST), as with
// kube-proxy. With HasUID, the proxy runs in the pod as UID (real uid in
// the initial user namespace: Istio 1337, Linkerd 2102) and its own
// connects are translated. UDP is translated for every pod.
type Proxied struct {
	Cgroup string
	UID    uint32
	HasUID bool
}

func (p Proxied) String() string {
	if p.HasUID {
		return fmt.Sprintf("%s (proxy uid %d)", p.Cgroup, p.UID)
	}
	return p.Cgroup
}

// proxiedState is a pod written in ez_svc_proxied.
type proxiedState struct {
	level uint32 // the cgroup's depth below the cgroup2 root
	v     servicesEzSvcProxy
}

// cgroupLevel is how deep path is below the cgroup2 mount (the root is 0),
// as bpf_get_current_ancestor_cgroup_id counts.
func cgroupLevel(path string) (uint32, error) {
	root, err := cgroupv2.Root()
	if err != nil {
		return 0, err
	}
	rel, err := filepath.Rel(root, filepath.Clean(path))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return 0, fmt.Errorf("cgroup %s is not under the cgroup2 mount %s", path, root)
	}
	if rel == "." {
		return 0, nil
	}
	return uint32(strings.Count(rel, "/") + 1), nil
}

// SetProxied makes ps the pods left to their proxy: entries of pods no
// longer in ps are deleted, new or changed ones written, the others left
// alone. A pod whose cgroup cannot be read (gone meanwhile) is skipped and
// reported in the error; the others are written. The levels looked at are
// widened before new pods are written and narrowed after pods went.
func (lb *LB) SetProxied(ps []Proxied) error {
	want := map[uint64]proxiedState{}
	var errs []error
	for _, p := range ps {
		id, err := cgroupv2.ID(p.Cgroup)
		if err != nil {
			errs = append(errs, fmt.Errorf("services: pod left to its proxy: %w", err))
			continue
		}
		level, err := cgroupLevel(p.Cgroup)
		if err != nil {
			errs = append(errs, fmt.Errorf("services: pod left to its proxy: %w", err))
			continue
		}
		st := proxiedState{level: level, v: servicesEzSvcProxy{Uid: p.UID}}
		if p.HasUID {
			st.v.Flags = uint32(servicesEzSvcProxyFlagEZ_SVC_PROXY_UID)
		}
		want[id] = st
	}
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.closed {
		return errClosed
	}
	// Pinned entries an earlier agent wrote have no level here: the span
	// it wrote covers them until this first convergence.
	if err := lb.writeSpan(maps2(lb.proxied, want), lb.restoredSpan); err != nil {
		return errors.Join(append(errs, err)...)
	}
	for id, st := range want {
		if cur, ok := lb.proxied[id]; ok && cur == st {
			continue
		}
		if err := lb.objs.EzSvcProxied.Put(id, st.v); err != nil {
			errs = append(errs, fmt.Errorf("services: pod cgroup %d left to its proxy: %w", id, err))
			continue
		}
		lb.proxied[id] = st
	}
	for id := range lb.proxied {
		if _, ok := want[id]; ok {
			continue
		}
		if err := lb.objs.EzSvcProxied.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("services: pod cgroup %d no longer left to its proxy: %w", id, err))
			continue
		}
		delete(lb.proxied, id)
	}
	if err := lb.writeSpan(lb.proxied, servicesEzSvcProxySpan{}); err != nil {
		errs = append(errs, err)
	} else {
		lb.restoredSpan = servicesEzSvcProxySpan{}
	}
	return errors.Join(errs...)
}

// maps2 is the union of a and b (b's values win).
func maps2(a, b map[uint64]proxiedState) map[uint64]proxiedState {
	out := make(map[uint64]proxiedState, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// writeSpan writes the levels of the cgroups in ps, widened to extra's
// (none: max 0, the lookup is skipped).
func (lb *LB) writeSpan(ps map[uint64]proxiedState, extra servicesEzSvcProxySpan) error {
	sp := extra
	for _, st := range ps {
		if sp.Max == 0 || st.level < sp.Min {
			sp.Min = st.level
		}
		sp.Max = max(sp.Max, st.level)
	}
	if sp.Max != 0 && sp.Max-sp.Min >= servicesProxySpan {
		return fmt.Errorf("services: pods left to their proxy at cgroup levels %d..%d: at most %d levels apart", sp.Min, sp.Max, servicesProxySpan)
	}
	if err := lb.objs.EzSvcProxyLevels.Put(uint32(0), sp); err != nil {
		return fmt.Errorf("services: pods left to their proxy: levels: %w", err)
	}
	return nil
}

const servicesProxySpan = uint32(servicesEzSvcProxyLimitEZ_SVC_PROXY_SPAN)

// ProxiedPods is how many pods are left to their proxy.
func (lb *LB) ProxiedPods() int {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	return len(lb.proxied)
}

// restoreProxied reads the pods an earlier agent left to their proxy; they
// stay so until the source's first state says otherwise.
func (lb *LB) restoreProxied() error {
	var id uint64
	var v servicesEzSvcProxy
	var sp servicesEzSvcProxySpan
	if err := lb.objs.EzSvcProxyLevels.Lookup(uint32(0), &sp); err != nil {
		return fmt.Errorf("services: read pinned proxy levels: %w", err)
	}
	it := lb.objs.EzSvcProxied.Iterate()
	for it.Next(&id, &v) {
		// The level is not stored: the pinned span covers the entry until
		// the next SetProxied recomputes it from the path.
		lb.proxied[id] = proxiedState{level: sp.Min, v: v}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("services: read pinned pods left to their proxy: %w", err)
	}
	if len(lb.proxied) > 0 {
		lb.restoredSpan = sp
	}
	return nil
}
