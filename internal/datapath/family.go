package datapath

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// A Family is one loaded datapath family: its programs, loaded against its
// maps pinned under the datapath's pin directory. Install makes its
// install-time changes within the manager's transaction; Close releases
// this process's handles (pinned, it keeps working). The shortcut, the
// bridge bypass and the Service load balancer implement it; the tracer
// pins nothing (`eztunnel trace` loads it for its run) and is not one.
type Family interface {
	// Name names the family in errors and logs.
	Name() string
	// Install gives the links an earlier agent pinned this load's programs
	// in place, and makes the family's attachments to cgroups, within tx:
	// on rollback every pinned link has its old program and nothing new
	// stays pinned. What converges later (the bypass's devices, NodePort
	// devices, Service frontends) is the family's own business.
	Install(tx *bpfsys.Tx, cgroups []string) error
	// Parts reports which of its parts loaded, and why others did not.
	Parts() parts.Report
	Close() error
}

// Families says which families run beside the shortcut (always on). A
// family an earlier agent pinned that is not wanted now is removed once
// the install has committed.
type Families struct {
	// Bypass: whether the bridge bypass runs, and why not (the parts
	// report). A kernel that refuses the bypass's programs turns it off
	// with the reason, unless Required: then it is an error.
	Bypass bypass.Options
	// Services runs the Service load balancer.
	Services bool
}

// kind is how the manager finds a family: whether it is wanted, how it is
// loaded, its directory (maps, links, legacy tc records), how what an earlier agent pinned of it is
// removed, and how a kernel is probed for it (`eztunnel preflight`).
type kind struct {
	name string
	// maps: the family's directory in the pin directory, where its maps,
	// links and legacy tc records are pinned ("": the pin directory itself,
	// the shortcut's).
	maps     string
	wanted   func(Config) bool
	optional func(Config) bool // a load error turns it off instead of failing the install
	// migrate renames what an earlier build pinned under older names,
	// within the install's transaction, before load (nil: nothing to).
	migrate func(tx *bpfsys.Tx, dir string) error
	load    func(cfg Config, dir string) (Family, error)
	unpin   func(dir string) (int, error)
	probe   func() parts.Report
}

// kinds are the families in install order: each may use what the ones
// before it attached (the Service load balancer's cgroup hooks run after
// the shortcut's).
var kinds = []kind{
	{
		name:     "shortcut",
		wanted:   func(Config) bool { return true },
		optional: func(Config) bool { return false },
		migrate:  shortcut.Migrate,
		load: func(cfg Config, dir string) (Family, error) {
			sc, err := shortcut.Load(cfg.Config, dir)
			if err != nil {
				return nil, err
			}
			return shortcutFamily{sc}, nil
		},
		probe: shortcut.Probe,
	},
	{
		name:     "bypass",
		maps:     bypass.MapDir,
		wanted:   func(c Config) bool { return c.Families.Bypass.On },
		optional: func(c Config) bool { return !c.Families.Bypass.Required },
		load: func(c Config, dir string) (Family, error) {
			b, err := bypass.Load(bypass.Config{Options: c.Families.Bypass, PinDir: dir})
			if err != nil {
				return nil, fmt.Errorf("--bypass: %w", err)
			}
			return b, nil
		},
		migrate: bypass.Migrate,
		unpin:   bypass.Unpin,
		probe: func() parts.Report {
			var rep parts.Report
			rep.Set(bypass.Probe())
			return rep
		},
	},
	{
		name:     "services",
		maps:     lb.MapDir,
		wanted:   func(c Config) bool { return c.Families.Services },
		optional: func(Config) bool { return false },
		load: func(_ Config, dir string) (Family, error) {
			l, err := lb.Load(lb.Config{PinDir: dir})
			if err != nil {
				return nil, fmt.Errorf("--services: %w", err)
			}
			return l, nil
		},
		migrate: lb.Migrate,
		unpin:   lb.Unpin,
		probe:   lb.Probe,
	},
}

// Probe reports which parts of every family this kernel and process can
// run, by trial loads (nothing pinned or attached).
func Probe() parts.Report {
	var rep parts.Report
	for _, k := range kinds {
		rep.Merge(k.probe())
	}
	return rep
}

// loadFamilies loads the wanted families into d against dir, within tx: a
// family whose maps this install pins for the first time has them removed
// on rollback. An optional family the kernel refuses is off, with the
// reason in d.off.
func (d *Datapath) loadFamilies(tx *bpfsys.Tx, dir string) error {
	for _, k := range kinds {
		if !k.wanted(d.cfg) {
			continue
		}
		if k.maps != "" && !bpfsys.Exists(filepath.Join(dir, k.maps)) {
			maps := filepath.Join(dir, k.maps)
			tx.OnRollback(func() error { return os.RemoveAll(maps) })
		}
		if k.migrate != nil {
			if err := k.migrate(tx, dir); err != nil {
				return fmt.Errorf("%s: adopt the pins of an earlier build: %w", k.name, err)
			}
		}
		f, err := k.load(d.cfg, dir)
		if err != nil && k.optional(d.cfg) {
			d.off[k.name] = err
			continue
		}
		if err != nil {
			return err
		}
		d.families = append(d.families, f)
	}
	return nil
}

// removeUnwanted registers, for the commit, the removal of what an earlier
// agent pinned of the families not running now.
func (d *Datapath) removeUnwanted(tx *bpfsys.Tx, dir string) {
	for _, k := range kinds {
		if k.unpin == nil || d.family(k.name) != nil {
			continue
		}
		tx.OnCommit(func() error {
			n, err := k.unpin(dir)
			if err != nil {
				return fmt.Errorf("remove the %s of an earlier agent: %w", k.name, err)
			}
			if n > 0 {
				d.removed[k.name] = n
			}
			return nil
		})
	}
}

// family is the loaded family named name, or nil.
func (d *Datapath) family(name string) Family {
	for _, f := range d.families {
		if f.Name() == name {
			return f
		}
	}
	return nil
}

// shortcutFamily is the socket shortcut as a Family: its install attaches
// to the cgroups, then the RST on close to the node's devices and to the
// loopback of the cgroups' network namespaces.
type shortcutFamily struct{ *shortcut.Shortcut }

func (shortcutFamily) Name() string { return "shortcut" }

func (f shortcutFamily) Install(tx *bpfsys.Tx, cgroups []string) error {
	if err := f.Attach(tx, cgroups); err != nil {
		return err
	}
	st, err := scanState()
	if err != nil {
		return fmt.Errorf("devices for the RST on close: %w", err)
	}
	p, err := resetPlan(f.Shortcut, st, f.coverCgroups(cgroups), cgroups)
	if err != nil {
		return fmt.Errorf("devices and namespaces for the RST on close: %w", err)
	}
	if _, _, _, err := f.SyncDevices(tx, p.devs); err != nil {
		return err
	}
	_, _, _, err = f.SyncLoopbacks(tx, p.nss)
	return err
}

// coverCgroups are the cgroups whose processes' namespaces the install
// covers: the managed ones, none with the cgroup filter and
// --close-reset-devices=covered (Kubernetes mode: the selection, not known
// yet, comes with the agent's SyncLoopbacks; what is pinned stays).
func (f shortcutFamily) coverCgroups(cgroups []string) []string {
	if f.CoveredOnly() && f.CgroupFilter() {
		return nil
	}
	return cgroups
}
