package bpfsys

import (
	"errors"
	"fmt"
	"maps"

	"github.com/cilium/ebpf"
)

// Programs of one object loaded on their own: the object's maps (data
// sections and variables included) load once, then each program against
// them, so a program the kernel refuses takes down only the part it serves.
type Programs struct {
	spec *ebpf.CollectionSpec
	opts ebpf.CollectionOptions
	// Coll holds the maps and variables; its Programs stay empty.
	Coll *ebpf.Collection
}

// LoadMaps loads every map and variable of spec (pinning by opts), no program.
func LoadMaps(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) (*Programs, error) {
	onlyMaps := spec.Copy()
	onlyMaps.Programs = map[string]*ebpf.ProgramSpec{}
	var o ebpf.CollectionOptions
	if opts != nil {
		o = *opts
	}
	coll, err := ebpf.NewCollectionWithOptions(onlyMaps, o)
	if err != nil {
		return nil, err
	}
	return &Programs{spec: spec, opts: o, Coll: coll}, nil
}

// Load loads one program against the maps. part names what the program
// serves, for the error.
func (p *Programs) Load(name, part string) (*ebpf.Program, error) {
	ps, ok := p.spec.Programs[name]
	if !ok {
		return nil, fmt.Errorf("program %s (%s): not in the object", name, part)
	}
	one := p.spec.Copy()
	one.Programs = map[string]*ebpf.ProgramSpec{name: ps}
	o := p.opts
	o.MapReplacements = maps.Clone(p.Coll.Maps)
	for k, v := range p.opts.MapReplacements {
		o.MapReplacements[k] = v
	}
	coll, err := ebpf.NewCollectionWithOptions(one, o)
	if err != nil {
		return nil, ProgramError(name, part, err)
	}
	prog := coll.DetachProgram(name)
	coll.Close()
	return prog, nil
}

// Close closes the maps' handles (pinned maps stay).
func (p *Programs) Close() {
	if p != nil && p.Coll != nil {
		p.Coll.Close()
	}
}

// ProgramError names the program and the part a load error is about, with
// the verifier's last lines (the whole log at %+v of the wrapped error).
func ProgramError(name, part string, err error) error {
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		return fmt.Errorf("program %s (%s): verifier rejected it: %w", name, part, verr)
	}
	return fmt.Errorf("program %s (%s): %w", name, part, err)
}
