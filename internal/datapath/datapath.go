package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpffs"
)

// Schema names the layout of the pinned maps. Bump it whenever a map's key,
// value or type changes; a datapath pinned under another schema is refused.
const Schema = "v1"

// DefaultPinRoot is where the datapath is pinned unless configured otherwise.
const DefaultPinRoot = "/sys/fs/bpf/eztunnel"

// Config sizes the maps and places the pins.
type Config struct {
	PinRoot    string // bpffs directory; the datapath lives in PinRoot/Schema
	MaxSockets uint32 // entries of the sockhash (two per accelerated connection)
	MaxPairs   uint32 // connections being set up at once
	Select     Selection
}

// DefaultConfig is what `eztunnel run` uses without flags.
func DefaultConfig() Config {
	return Config{PinRoot: DefaultPinRoot, MaxSockets: 131072, MaxPairs: 16384}
}

// Validate rejects a configuration before anything is loaded.
func (c Config) Validate() error {
	if c.PinRoot == "" || !filepath.IsAbs(c.PinRoot) {
		return fmt.Errorf("pin path %q must be an absolute path", c.PinRoot)
	}
	if c.MaxSockets < 2 || c.MaxSockets > 1<<24 {
		return fmt.Errorf("max sockets %d out of range [2, %d]", c.MaxSockets, 1<<24)
	}
	if c.MaxPairs < 1 || c.MaxPairs > 1<<24 {
		return fmt.Errorf("max pairs %d out of range [1, %d]", c.MaxPairs, 1<<24)
	}
	return c.Select.Validate()
}

// Dir is the pin directory of this schema.
func (c Config) Dir() string { return filepath.Join(c.PinRoot, Schema) }

// Datapath is a loaded socket shortcut. Its maps and links are pinned: closing
// the Datapath releases this process's handles and leaves the datapath
// working; Uninstall removes it.
type Datapath struct {
	cfg   Config
	objs  shortcutObjects
	links []link.Link
}

// Load loads the programs, reusing the pinned maps of an installed datapath of
// the same schema (so a restart or upgrade keeps every connection's state).
func Load(cfg Config) (_ *Datapath, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	spec, err := loadShortcut()
	if err != nil {
		return nil, fmt.Errorf("datapath: parse embedded object: %w", err)
	}
	var specs shortcutSpecs
	if err := spec.Assign(&specs); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	specs.EzSockets.MaxEntries = cfg.MaxSockets
	specs.EzPairs.MaxEntries = cfg.MaxPairs
	specs.EzAliases.MaxEntries = cfg.MaxPairs
	specs.EzSynIndex.MaxEntries = cfg.MaxPairs
	if err := specs.EzCfgFlags.Set(cfg.Select.flags()); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	// Selection rule maps are left unpinned: every load writes its own.
	for _, m := range []*ebpf.MapSpec{specs.EzSockets, specs.EzPairs, specs.EzAliases, specs.EzSynIndex, specs.EzSocks, specs.EzCounters, specs.EzControl} {
		m.Pinning = ebpf.PinByName
	}

	if err := otherSchema(cfg); err != nil {
		return nil, err
	}
	fresh := !exists(cfg.Dir())
	if err := bpffs.Ensure(cfg.PinRoot); err != nil {
		return nil, err
	}
	if err := bpffs.Ensure(cfg.Dir()); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil && fresh {
			os.RemoveAll(cfg.Dir())
			os.Remove(cfg.PinRoot)
		}
	}()

	d := &Datapath{cfg: cfg}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.Dir()}}
	if err := spec.LoadAndAssign(&d.objs, opts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("datapath: verifier rejected a program: %+v", verr)
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("datapath: pinned maps in %s do not match this build (map sizes or schema changed); run `eztunnel uninstall` first: %w", cfg.Dir(), err)
		}
		return nil, fmt.Errorf("datapath: load: %w", err)
	}
	if err := d.writeSelection(cfg.Select); err != nil {
		d.objs.Close()
		return nil, fmt.Errorf("datapath: %w", err)
	}
	return d, nil
}

// otherSchema refuses to install next to a datapath pinned by a build with
// another map layout: both would attach to the same cgroups.
func otherSchema(cfg Config) error {
	entries, err := os.ReadDir(cfg.PinRoot)
	if err != nil {
		return nil // nothing installed yet
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != Schema && strings.HasPrefix(e.Name(), "v") {
			return fmt.Errorf("a datapath of schema %s is installed in %s and this build uses schema %s; "+
				"migrating between schemas is not supported: run `eztunnel uninstall` of that version first",
				e.Name(), cfg.PinRoot, Schema)
		}
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Close releases this process's handles. Pinned state stays.
func (d *Datapath) Close() error {
	for _, l := range d.links {
		l.Close()
	}
	d.links = nil
	return d.objs.Close()
}

// Config returns the configuration the datapath was loaded with.
func (d *Datapath) Config() Config { return d.cfg }
