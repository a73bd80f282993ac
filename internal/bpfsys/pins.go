package bpfsys

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Exists reports whether path exists.
func Exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// CheckSchema refuses to install under root next to a datapath pinned by a
// build with another map layout (another "v<N>" directory): both would
// attach to the same hooks.
func CheckSchema(root, schema string) error {
	for _, s := range PinnedSchemas(root) { // none: nothing installed yet
		if s != schema {
			return fmt.Errorf("a datapath of schema %s is installed in %s and this build uses schema %s; "+
				"migrating between schemas is not supported: run `eztunnel uninstall` of that version first",
				s, root, schema)
		}
	}
	return nil
}

// PinnedSchemas lists the schema directories (v<N>) under root: the
// datapaths pinned there; none when root does not exist.
func PinnedSchemas(root string) []string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "v") {
			out = append(out, e.Name())
		}
	}
	return out
}

// Links are pinned under <dir>/links/<kind>/..., one directory per kind of
// attachment point, so uninstall and adoption find them by walking.
const (
	LinksDir      = "links"
	KindCgroup    = "cgroup"    // links/cgroup/<cgroup id>/<program>
	KindNetfilter = "netfilter" // links/netfilter/<program>_<family>
	KindTracing   = "tracing"   // links/tracing/<program>
	KindTCX       = "tcx"       // links/tcx/<netns cookie>/<ifindex>/<program>_<direction>
	// KindServices: links/services/<cgroup id>/<program>, where builds before
	// per-family directories pinned the Service LB's cgroup hooks (now
	// services/links/cgroup/...; services.Migrate moves them).
	KindServices = "services"
)

// LinkPin is the pin path of a link: <dir>/links/<kind>/<parts...>.
func LinkPin(dir, kind string, parts ...string) string {
	return filepath.Join(append([]string{dir, LinksDir, kind}, parts...)...)
}

// PinnedLinks lists every pin under <dir>/links, in lexical order.
func PinnedLinks(dir string) ([]string, error) {
	var pins []string
	err := filepath.WalkDir(filepath.Join(dir, LinksDir), func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && path == filepath.Join(dir, LinksDir) {
			return fs.SkipDir
		}
		if err != nil {
			return err
		}
		if !d.IsDir() {
			pins = append(pins, path)
		}
		return nil
	})
	return pins, err
}

// UnpinLinks unpins and closes every link pinned under <dir>/links (a
// pinned link lives as long as its pin), in reverse lexical order so that a
// cgroup's ez_sc_sockops goes before its ez_sc_egress, detaches the legacy tc
// filters recorded under <dir>/tc, and removes the directories.
func UnpinLinks(dir string) error {
	pins, err := PinnedLinks(dir)
	if err != nil {
		return err
	}
	slices.Reverse(pins)
	for _, pin := range pins {
		if err := UnpinLink(pin); err != nil {
			return err
		}
	}
	if err := DetachTCFilters(dir); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(dir, LinksDir))
}

// UnpinLink unpins the link pinned at pin; it is detached once no process
// holds it either. Nothing pinned there is not an error.
func UnpinLink(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	err = l.Unpin()
	l.Close()
	if err != nil {
		return fmt.Errorf("unpin %s: %w", pin, err)
	}
	return nil
}

// MovePin renames a pin (bpffs supports rename), creating the directories of to.
func MovePin(from, to string) error {
	if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
		return err
	}
	if err := os.Rename(from, to); err != nil {
		return fmt.Errorf("move pin %s to %s: %w", from, to, err)
	}
	return nil
}

// AttachPinned returns a link running prog, pinned at pin. A link already
// pinned there that keep accepts (its device or target is still the one
// wanted; nil: any) gets prog in place (link.Update: never a moment
// without a program); one it does not is unpinned. Otherwise attach makes
// a new link, which is pinned at pin, creating its directories. pin "":
// attach only, nothing pinned.
func AttachPinned(pin string, prog *ebpf.Program, keep func(*link.Info) bool, attach func() (link.Link, error)) (link.Link, error) {
	if pin == "" {
		return attach()
	}
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		info, ierr := old.Info()
		if ierr != nil {
			old.Close()
			return nil, fmt.Errorf("link info of %s: %w", pin, ierr)
		}
		if keep == nil || keep(info) {
			if err := old.Update(prog); err != nil {
				old.Close()
				return nil, fmt.Errorf("update pinned link %s: %w", pin, err)
			}
			return old, nil
		}
		old.Close()
		if err := UnpinLink(pin); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	l, err := attach()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		l.Close()
		return nil, err
	}
	if err := l.Pin(pin); err != nil {
		l.Close()
		return nil, fmt.Errorf("pin link %s: %w", pin, err)
	}
	return l, nil
}

// OpenPinnedMap opens the map pinned at dir/name read-only (the status
// commands read a datapath an agent may be running).
func OpenPinnedMap(dir, name string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", name, err)
	}
	return m, nil
}
