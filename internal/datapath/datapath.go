// Package datapath installs, adopts, reports and uninstalls eztunnel's
// socket shortcut (internal/datapath/shortcut), and owns the pin directory
// every family pins in: the bridge bypass (internal/datapath/bypass) and
// the Service load balancer (internal/datapath/services) are loaded by the
// agent against that directory (internal/agent); the tracer pins nothing
// (`eztunnel trace` loads it for its run). The shortcut's package has the
// shape the others follow:
//
//	Load(cfg, dir)           loads its programs against the maps pinned in dir
//	(*T).Attach(tx, targets) attaches within an install transaction, links under dir/links
//	(*T).Close()             releases this process's handles
//	Release(dir, drain)      hands its state back to the kernel before uninstall
//
// This package owns the shortcut's install order and rollback, and
// Uninstall, which unpins every family's links and maps. The shared
// plumbing lives in internal/bpfsys.
package datapath

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// Schema names the layout of the pinned maps. Bump it whenever a map's key,
// value or type changes; a datapath pinned under another schema is refused.
const Schema = "v2"

// DefaultPinRoot is where the datapath is pinned unless configured otherwise.
const DefaultPinRoot = bpfsys.DefaultPinRoot

// The socket shortcut's types, used by the agent, the CLI and the metrics.
type (
	Selection  = shortcut.Selection
	Counters   = shortcut.Counters
	Connection = shortcut.Connection
	Pinned     = shortcut.Pinned
	MapFill    = shortcut.MapFill
)

var (
	// ErrNotInstalled means no datapath is pinned under the configured path.
	ErrNotInstalled = shortcut.ErrNotInstalled
	// FillNames are the maps Pinned.ReadFill reports, in display order.
	FillNames = shortcut.FillNames
)

// CounterNames lists every counter name in enum order.
func CounterNames() []string { return shortcut.CounterNames() }

// ReadCounters sums the per-CPU counters of a counters map.
var ReadCounters = shortcut.ReadCounters

// Entries counts the entries of a hash-like map by walking its keys.
var Entries = shortcut.Entries

// Requirements lists what every family needs of the kernel and process.
func Requirements() []bpfsys.Requirement { return shortcut.Requirements }

// Config sizes the maps and places the pins.
type Config struct {
	PinRoot    string // bpffs directory; the datapath lives in PinRoot/Schema
	MaxSockets uint32 // entries of the sockhash (two per accelerated connection)
	MaxPairs   uint32 // connections being set up at once
	MaxUnread  uint32 // bytes a direction may leave unread before switching to the kernel path; 0: per receiver
	Select     Selection
	// CgroupFilter (Kubernetes mode): of the attached cgroup subtrees, only
	// the cgroups given to SetScope, and their descendants, are accelerated.
	CgroupFilter bool
}

// DefaultConfig is what `eztunnel run` uses without flags.
func DefaultConfig() Config {
	return Config{PinRoot: DefaultPinRoot, MaxSockets: 131072, MaxPairs: 16384}
}

func (c Config) shortcut() shortcut.Config {
	return shortcut.Config{MaxSockets: c.MaxSockets, MaxPairs: c.MaxPairs, MaxUnread: c.MaxUnread, Select: c.Select, CgroupFilter: c.CgroupFilter}
}

// Validate rejects a configuration before anything is loaded.
func (c Config) Validate() error {
	if c.PinRoot == "" || !filepath.IsAbs(c.PinRoot) {
		return fmt.Errorf("pin path %q must be an absolute path", c.PinRoot)
	}
	return c.shortcut().Validate()
}

// Dir is the pin directory of this schema.
func (c Config) Dir() string { return filepath.Join(c.PinRoot, Schema) }

// Datapath is an installed datapath. Its maps and links are pinned: closing
// it releases this process's handles and leaves the datapath working;
// Uninstall removes it.
type Datapath struct {
	cfg Config
	sc  *shortcut.Shortcut
}

// Close releases this process's handles and joins their errors. Pinned state stays.
func (d *Datapath) Close() error {
	var errs []error
	if d.sc != nil {
		errs = append(errs, d.sc.Close())
		d.sc = nil
	}
	return errors.Join(errs...)
}

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

// AgePairs deletes the socket shortcut's pairing records that can no longer
// complete, older than maxAge.
func (d *Datapath) AgePairs(maxAge time.Duration) (int, error) { return d.sc.AgePairs(maxAge) }

// ReleaseSwitched hands back to the kernel path the drained ends of
// connections that switched for backpressure (shortcut.ReleaseSwitched).
func (d *Datapath) ReleaseSwitched() error { return d.sc.ReleaseSwitched() }

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

// Parts reports which parts of the installed families loaded, and why others did not.
func (d *Datapath) Parts() parts.Report { return d.sc.Parts() }
