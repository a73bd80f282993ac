// Package datapath is the manager of eztunnel's datapath families: the
// socket shortcut (internal/datapath/shortcut), the bridge bypass
// (internal/datapath/bypass) and the Service load balancer
// (internal/datapath/services). Each is a Family (family.go): loaded
// against its maps pinned under one pin directory, installed within one
// transaction, closed, removed. The manager owns their order, the
// transaction and its rollback (Install: a failure anywhere leaves every
// family's pinned links with the programs they had and nothing new
// pinned), the removal of families an earlier agent pinned and this one
// does not run, the kernel probes (Probe) and Uninstall. The agent
// (internal/agent) converges what families attach at run time (the
// bypass's devices, the load balancer's frontends and NodePort devices)
// through the handles the manager gives it. The tracer pins nothing
// (`eztunnel trace` loads it for its run). The shared plumbing lives in
// internal/bpfsys.
package datapath

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/nodelayout"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// Schema and DefaultPinRoot: internal/nodelayout.
const (
	Schema         = nodelayout.Schema
	DefaultPinRoot = nodelayout.DefaultPinRoot
)

// The socket shortcut's types, used by the agent, the CLI and the metrics.
type (
	Selection  = shortcut.Selection
	Counters   = shortcut.Counters
	Connection = shortcut.Connection
	Listing    = shortcut.Listing
	Pinned     = shortcut.Pinned
	MapFill    = shortcut.MapFill
)

var (
	// ErrNotInstalled means no datapath is pinned under the configured path.
	ErrNotInstalled = shortcut.ErrNotInstalled
	// ErrPartial: an uninstall stopped part way; rerun it.
	ErrPartial = shortcut.ErrPartial
	// FillNames are the maps Pinned.ReadFill reports, in display order.
	FillNames = shortcut.FillNames
)

// CounterNames lists every counter name in enum order.
func CounterNames() []string { return shortcut.CounterNames() }

// ReadCounters sums the per-CPU counters of a counters map.
var ReadCounters = shortcut.ReadCounters

// Requirements lists what every family needs of the kernel and process.
func Requirements() []bpfsys.Requirement { return shortcut.Requirements }

// Config sizes the maps and places the pins.
type Config struct {
	PinRoot string // bpffs directory; the datapath lives in PinRoot/Schema
	RunDir  string // the agents' files (lock, parts report, log); "": nodelayout.DefaultRunDir
	// The socket shortcut's settings (sizes, the unread bound, selection,
	// the cgroup filter), validated once by shortcut.Config.Validate.
	shortcut.Config
	// Families beside the shortcut.
	Families Families
}

// DefaultConfig is what `eztunnel run` uses without flags.
func DefaultConfig() Config {
	return Config{PinRoot: DefaultPinRoot, Config: shortcut.Config{MaxSockets: 131072, MaxPairs: 16384}}
}

// Validate rejects a configuration before anything is loaded.
func (c Config) Validate() error {
	if c.PinRoot == "" || !filepath.IsAbs(c.PinRoot) {
		return fmt.Errorf("pin path %q must be an absolute path", c.PinRoot)
	}
	if c.RunDir != "" && !filepath.IsAbs(c.RunDir) {
		return fmt.Errorf("run directory %q must be an absolute path", c.RunDir)
	}
	return c.Config.Validate()
}

// Layout names the datapath's paths on the node.
func (c Config) Layout() nodelayout.Layout {
	return nodelayout.Layout{PinRoot: c.PinRoot, RunDir: c.RunDir}
}

// Dir is the pin directory of this schema (Layout().Pins()).
func (c Config) Dir() string { return c.Layout().Pins() }

// Datapath is an installed datapath: its families, loaded in install
// order. Their maps and links are pinned: closing it releases this
// process's handles and leaves the datapath working; Uninstall removes it.
type Datapath struct {
	cfg      Config
	families []Family
	sc       *shortcut.Shortcut // families[0]
	off      map[string]error   // wanted families the kernel refused: why
	removed  map[string]int     // families an earlier agent pinned, removed: their links
	// The close reset's devices (devices.go): the pods' devices SyncDevices
	// was last told, and with --close-reset-devices=covered the coverage
	// SyncLoopbacks last found (or Install).
	pods     podnet.State
	havePods bool
	cov      *coverage
	managed  []string // the cgroups Install attached to
}

// Close releases this process's handles of every family, in reverse
// install order, and joins their errors. Pinned state stays. Safe to call twice.
func (d *Datapath) Close() error {
	var errs []error
	for i := len(d.families) - 1; i >= 0; i-- {
		errs = append(errs, d.families[i].Close())
	}
	d.families, d.sc = nil, nil
	return errors.Join(errs...)
}

// Bypass is the bridge bypass family; nil when it does not run.
func (d *Datapath) Bypass() *bypass.Bypass {
	b, _ := d.family("bypass").(*bypass.Bypass)
	return b
}

// Services is the Service load balancer family; nil when it does not run.
func (d *Datapath) Services() *lb.LB {
	l, _ := d.family("services").(*lb.LB)
	return l
}

// Off says why the family name does not run ("": it runs): the kernel
// refused it at this install, or the caller's reason it was not asked for
// (Families.Bypass.Off).
func (d *Datapath) Off(name string) string {
	if err := d.off[name]; err != nil {
		return err.Error()
	}
	if name == "bypass" && d.Bypass() == nil {
		return firstOf(d.cfg.Families.Bypass.Off, "off (not asked for)")
	}
	return ""
}

// OffCode is the kind of Off's reason (parts.Codes), "" while it runs.
func (d *Datapath) OffCode(name string) parts.Code {
	if err := d.off[name]; err != nil {
		return parts.CodeOf(err)
	}
	if name == "bypass" && d.Bypass() == nil {
		if c := d.cfg.Families.Bypass.OffCode; c != "" {
			return c
		}
		return parts.CodeDisabledByFlag
	}
	return ""
}

// Removed lists the families an earlier agent pinned that this install
// removed (not wanted now), with the number of links each had.
func (d *Datapath) Removed() map[string]int { return d.removed }

// Config returns the configuration the datapath was installed with.
func (d *Datapath) Config() Config { return d.cfg }

// Shortcut is the socket-shortcut family of the datapath.
func (d *Datapath) Shortcut() *shortcut.Shortcut { return d.sc }

// Counters reads the socket shortcut's counters.
func (d *Datapath) Counters() (Counters, error) { return d.sc.Counters() }

// OpenPinned opens the maps of the datapath pinned under cfg.Dir(), for
// reading while no agent runs.
func OpenPinned(cfg Config) (*Pinned, error) { return shortcut.OpenPinned(cfg.Dir()) }

// Connections lists the accelerated sockets of the datapath pinned under cfg.Dir().
func Connections(cfg Config) ([]Connection, error) { return shortcut.Connections(cfg.Dir()) }

// ListConnections is Connections with how the listing was made.
func ListConnections(cfg Config) (Listing, error) { return shortcut.List(cfg.Dir()) }

// StreamConnections hands each end to emit as the listing walks them
// (shortcut.Stream: sorted in windows of shortcut.ListWindow ends).
func StreamConnections(ctx context.Context, cfg Config, emit func(Connection) error) (Listing, error) {
	return shortcut.Stream(ctx, cfg.Dir(), emit)
}

// AgePairs deletes the socket shortcut's pairing records that can no longer
// complete, older than maxAge.
func (d *Datapath) AgePairs(maxAge time.Duration) (int, error) { return d.sc.AgePairs(maxAge) }

// PairingFill counts the entries of the maps of handshakes in flight
// (shortcut.PairingFill).
func (d *Datapath) PairingFill() (map[string]MapFill, error) { return d.sc.PairingFill() }

// ReleaseSwitched hands back to the kernel path the drained ends of
// connections that switched for backpressure (shortcut.ReleaseSwitched).
func (d *Datapath) ReleaseSwitched() (busy bool, err error) { return d.sc.ReleaseSwitched() }

// SetScope makes the selected cgroups exactly ids (with CgroupFilter; see
// shortcut.SetScope). New connections see the change, established ones keep
// their path.
func (d *Datapath) SetScope(ids []uint64) (added, removed int, err error) { return d.sc.SetScope(ids) }

// ReconcileCgroups converges the attached cgroups to paths while the agent
// runs (shortcut.ReconcileCgroups).
func (d *Datapath) ReconcileCgroups(paths []string) (attached, missing []string, pruned []uint64, err error) {
	return d.sc.ReconcileCgroups(paths)
}

// Pruned lists the cgroups whose links Install detached: attached by an
// earlier agent and not wanted now, or removed since.
func (d *Datapath) Pruned() []uint64 { return d.sc.Pruned() }

// Parts reports which parts of every family run, and why others do not.
func (d *Datapath) Parts() parts.Report {
	rep := d.sc.Parts()
	if d.Bypass() != nil {
		rep.On(parts.Bypass, bypass.Via())
	} else {
		rep.Off(parts.Bypass, d.OffCode("bypass"), d.Off("bypass"))
	}
	if l := d.Services(); l != nil {
		rep.Merge(l.Parts())
	} else {
		for _, p := range []parts.Name{parts.ServicesLB, parts.NodePort, parts.SocketDestroy} {
			rep.Off(p, parts.CodeDisabledByFlag, "off (no --services)")
		}
	}
	return rep
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
