// Package svcsync keeps the Service load balancer's maps equal to the
// Services it is told about: ClusterIP frontends and their backends from
// Kubernetes Services and EndpointSlices (client-go informers) or from a
// file. Updates are per Service: a change rewrites that Service's frontends
// only.
package svcsync

import (
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

// Writer writes frontends (the datapath's *services.LB).
type Writer interface {
	SetFrontend(lb.Frontend, lb.Target) error
	DeleteFrontend(lb.Frontend) error
}

// Entries are one Service's frontends and what each translates to.
type Entries map[lb.Frontend]lb.Target

// Skip reasons (eztunnel_services_skipped_total{reason}).
const (
	SkipNoPorts     = "no_ports"     // a Service without ports
	SkipProtocol    = "protocol"     // a port neither TCP nor UDP (SCTP, unknown)
	SkipFamily      = "family"       // a ClusterIP of a family the node does not serve
	SkipBadAddress  = "bad_address"  // a ClusterIP, port or backend that does not parse
	SkipConflict    = "conflict"     // a frontend another Service already has
	SkipWriteFailed = "write_failed" // the map write failed (full, ...)
	SkipLBProxy     = "lb_proxy"     // a load-balancer IP of ipMode Proxy: left to the load balancer, as kube-proxy does
)

// SkipReasons are every skip reason, for the metrics to report each.
var SkipReasons = []string{SkipNoPorts, SkipProtocol, SkipFamily, SkipBadAddress, SkipConflict, SkipWriteFailed, SkipLBProxy}

// Recorder takes what the table did (Metrics).
type Recorder interface {
	Synced(time.Duration)                                     // from a change seen to its frontends written
	SetState(frontends, backends int, skipped map[string]int) // the totals after each Apply
	SetProxied(proxied, invalid int)                          // pods left to their proxy, choices that do not parse
}

// Table applies Services to a Writer and remembers what each wrote.
type Table struct {
	mu      sync.Mutex
	w       Writer
	m       Recorder // nil: none
	log     *slog.Logger
	applied map[string]Entries     // by Service (namespace/name)
	skipped map[string][]string    // by Service: reasons of the parts not written
	owner   map[lb.Frontend]string // which Service a frontend is written for
	// Totals kept up to date by Apply (the metrics), not recounted.
	frontends, backends int
	skips               map[string]int
}

// NewTable writes to w and records to m (nil: nothing).
func NewTable(w Writer, m Recorder, log *slog.Logger) *Table {
	if log == nil {
		log = slog.Default()
	}
	return &Table{w: w, m: m, log: log, applied: map[string]Entries{}, skipped: map[string][]string{}, skips: map[string]int{}, owner: map[lb.Frontend]string{}}
}

// Apply makes name's frontends equal to e (nil or empty: the Service is
// gone). Only frontends whose backends changed are written. since is when
// the change was seen (the sync latency is measured from it). skipped are
// the reasons parts of the Service were not translated into e; a frontend
// another Service holds, or whose write fails, is skipped too. Skipped
// parts are reported until the Service's next Apply.
func (t *Table) Apply(name string, e Entries, skipped []string, since time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.applied[name]
	t.count(old, t.skipped[name], -1)
	skipped = slices.Clone(skipped) // appended to below
	next := Entries{}
	wrote := false
	for f := range old {
		if _, ok := e[f]; ok {
			continue
		}
		if err := t.w.DeleteFrontend(f); err != nil {
			t.log.Warn("services: delete frontend", "service", name, "frontend", f.String(), "err", err)
			next[f] = old[f] // still written
			continue
		}
		delete(t.owner, f)
		wrote = true
	}
	for _, f := range slices.SortedFunc(maps.Keys(e), cmpFrontend) {
		tg := lb.Target{Backends: sortedBackends(e[f].Backends), Listed: e[f].Listed, Affinity: e[f].Affinity, KeepSource: e[f].KeepSource, External: e[f].External}
		if o, ok := t.owner[f]; ok && o != name {
			// A ClusterIP takes its address from another Service's
			// ExternalIP or load-balancer IP, whichever was applied first:
			// else a tenant's Service naming the cluster DNS's ClusterIP as
			// its ExternalIP would take its traffic after a restart.
			if tg.External || !t.applied[o][f].External {
				skipped = append(skipped, SkipConflict)
				t.log.Warn("services: frontend already written for another Service; skipped", "service", name, "frontend", f.String(), "owner", o)
				continue
			}
			t.yield(o, f, name)
		}
		if prev, ok := old[f]; ok && slices.Equal(prev.Backends, tg.Backends) && prev.Affinity == tg.Affinity && prev.KeepSource == tg.KeepSource && prev.External == tg.External {
			next[f] = prev
			continue
		}
		if err := t.w.SetFrontend(f, tg); err != nil {
			skipped = append(skipped, SkipWriteFailed)
			t.log.Warn("services: write frontend", "service", name, "frontend", f.String(), "err", err)
			if prev, ok := old[f]; ok {
				next[f] = prev // the previous state stays written
			}
			continue
		}
		next[f] = tg
		t.owner[f] = name
		wrote = true
	}
	if len(next) == 0 {
		delete(t.applied, name)
	} else {
		t.applied[name] = next
	}
	if len(skipped) == 0 {
		delete(t.skipped, name)
	} else {
		t.skipped[name] = skipped
	}
	t.count(next, skipped, 1)
	if t.m == nil {
		return
	}
	if wrote {
		t.m.Synced(time.Since(since))
	}
	t.m.SetState(t.frontends, t.backends, maps.Clone(t.skips))
}

// Skipped counts the parts of Services not written, by reason.
func (t *Table) Skipped() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.skips)
}

// count adds (sign 1) or removes (-1) one Service's part of the totals.
// yield takes frontend f from Service o's applied entries, counted as
// skipped for o (a conflict), for Service by; the caller writes f over.
func (t *Table) yield(o string, f lb.Frontend, by string) {
	oe := t.applied[o]
	t.count(oe, t.skipped[o], -1)
	delete(oe, f)
	t.skipped[o] = append(t.skipped[o], SkipConflict)
	if len(oe) == 0 {
		delete(t.applied, o)
	}
	t.count(oe, t.skipped[o], 1)
	delete(t.owner, f)
	t.log.Warn("services: an ExternalIP or load-balancer IP gives way to a ClusterIP at its address", "service", o, "frontend", f.String(), "to", by)
}

func (t *Table) count(e Entries, skipped []string, sign int) {
	for _, tg := range e {
		t.frontends += sign
		t.backends += sign * len(tg.Backends)
	}
	for _, r := range skipped {
		if t.skips[r] += sign; t.skips[r] == 0 {
			delete(t.skips, r)
		}
	}
}

// Names lists the Services with frontends written, sorted.
func (t *Table) Names() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.applied))
}

// Frontends is a copy of what is written for name.
func (t *Table) Frontends(name string) Entries {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.applied[name])
}

func cmpFrontend(a, b lb.Frontend) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Port != b.Port {
		return int(a.Port) - int(b.Port)
	}
	return int(a.Proto) - int(b.Proto)
}

// sortedBackends sorts and dedups (IPv4-mapped addresses unmapped).
func sortedBackends(in []lb.Backend) []lb.Backend {
	out := make([]lb.Backend, 0, len(in))
	for _, b := range in {
		out = append(out, netip.AddrPortFrom(b.Addr().Unmap(), b.Port()))
	}
	slices.SortFunc(out, func(a, b lb.Backend) int { return a.Compare(b) })
	return slices.Compact(out)
}

// Prune deletes the frontends written (listed by list, e.g. an LB
// restored from pins an earlier agent wrote) that no Service of the table
// has: Services deleted while no agent ran. Call it after the source's
// first full state was applied. It returns what it deleted.
func (t *Table) Prune(list func() []lb.Frontend) []lb.Frontend {
	t.mu.Lock()
	defer t.mu.Unlock()
	var gone []lb.Frontend
	for _, f := range list() {
		if _, ok := t.owner[f]; ok {
			continue
		}
		if err := t.w.DeleteFrontend(f); err != nil {
			t.log.Warn("services: delete a frontend no Service has", "frontend", f.String(), "err", err)
			continue
		}
		gone = append(gone, f)
	}
	return gone
}
