package datapath

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// PinnedLink is one link pinned under <pin-path>/<schema>/links (the
// shortcut's) or <pin-path>/<schema>/<family>/links, or the record of a
// legacy tc filter under .../tc (ID 0).
type PinnedLink struct {
	Pin     string         `json:"pin"` // relative to the schema directory
	ID      link.ID        `json:"id"`
	Program ebpf.ProgramID `json:"program_id"`
}

// Links lists the links of every family of the datapath pinned under cfg.Dir().
func Links(cfg Config) ([]PinnedLink, error) {
	dir := cfg.Dir()
	if !bpfsys.Exists(dir) {
		return nil, fmt.Errorf("%w at %s", ErrNotInstalled, dir)
	}
	var out []PinnedLink
	for _, k := range kinds {
		ls, err := links(dir, filepath.Join(dir, k.maps))
		if err != nil {
			return nil, err
		}
		out = append(out, ls...)
	}
	return out, nil
}

// links lists the links and legacy tc records pinned under fam, with
// their pins relative to dir.
func links(dir, fam string) ([]PinnedLink, error) {
	pins, err := bpfsys.PinnedLinks(fam)
	if err != nil {
		return nil, err
	}
	out := make([]PinnedLink, 0, len(pins))
	for _, pin := range pins {
		l, err := link.LoadPinnedLink(pin, nil) // quirk: links refuse BPF_F_RDONLY (EINVAL)
		if err != nil {
			return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			return nil, fmt.Errorf("link info of %s: %w", pin, err)
		}
		rel, _ := filepath.Rel(dir, pin)
		out = append(out, PinnedLink{Pin: rel, ID: info.ID, Program: info.Program})
	}
	// Legacy tc filters (kernels without tcx): their records, no link id.
	recs, err := bpfsys.TCRecords(fam)
	if err != nil {
		return nil, err
	}
	for _, rec := range recs {
		p, err := ebpf.LoadPinnedProgram(rec, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open tc filter record %s: %w", rec, err)
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			return nil, fmt.Errorf("program info of %s: %w", rec, err)
		}
		id, _ := info.ID()
		rel, _ := filepath.Rel(dir, rec)
		out = append(out, PinnedLink{Pin: rel, Program: id})
	}
	return out, nil
}
