package bpfsys

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/eztunnel/eztunnel/internal/parts"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
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
	if TestRefused(name) {
		return nil, ProgramError(name, part, fmt.Errorf("%w (%s)", ErrTestRefused, TestRefuseEnv))
	}
	// A program type the kernel lacks fails its load with a bare EINVAL:
	// say which (netfilter: Linux 6.4).
	if err := features.HaveProgramType(ps.Type); errors.Is(err, ebpf.ErrNotSupported) {
		return nil, ProgramError(name, part, fmt.Errorf("program type %s not supported by this kernel", ps.Type))
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

// TestRefuseEnv names programs (comma-separated) that Load refuses as the
// kernel would, for tests that prove a part turns off alone on a kernel
// that refuses it (docs/kernels.md). Never set it in production.
const TestRefuseEnv = "EZTUNNEL_TEST_REFUSE_PROGRAMS"

// ErrTestRefused is the refusal TestRefuseEnv causes.
var ErrTestRefused = parts.WithCode(parts.CodeRefusedForTest, errors.New("refused for a test"))

// TestRefused reports whether TestRefuseEnv names the program.
func TestRefused(name string) bool {
	return slices.Contains(strings.Split(os.Getenv(TestRefuseEnv), ","), name)
}

// TestRefusal is the refusal of name when TestRefuseEnv names it, for
// probes that refuse a kernel feature by name before anything loads; nil
// otherwise.
func TestRefusal(name string) error {
	if !TestRefused(name) {
		return nil
	}
	return fmt.Errorf("%s %w (%s)", name, ErrTestRefused, TestRefuseEnv)
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
	if errors.Is(err, ebpf.ErrNotSupported) && strings.Contains(err.Error(), "kfunc") {
		// cilium/ebpf finds a module's kfuncs only while it is loaded; the
		// kernel never loads a module for a kfunc.
		return fmt.Errorf("program %s (%s): %w (not in this kernel, or its module is not loaded: nf_conntrack and nf_nat hold the conntrack kfuncs)", name, part, err)
	}
	return fmt.Errorf("program %s (%s): %w", name, part, err)
}

// Group is the programs one part needs: all load, or the part is off.
type Group struct {
	Part parts.Name
	// Required: the component cannot run without it; a refusal fails the load.
	Required bool
	Progs    []string
	Via      string // the mechanism, for the report
	// Off: the part cannot run in this configuration, and why (nothing
	// loads); its code (parts.CodeOf) is the metrics' reason.
	Off error
	// Attach, when set, checks the group's last program can be attached
	// the way the part attaches it (e.g. TCX); a refusal turns the part off
	// as a refused load does.
	Attach func(*ebpf.Program) error
	// Fallback, when set, is tried when the group cannot load: its programs
	// serve the same part another way (its Part and Required are the
	// group's). Its Via then names the primary's refusal too.
	Fallback *Group
}

// LoadGroups loads each group's programs and records each part in rep:
// on, or off with the refusal that named the program. It returns the
// programs loaded, by name; on a required group's refusal, none (closed).
func (p *Programs) LoadGroups(groups []Group, rep *parts.Report) (map[string]*ebpf.Program, error) {
	loaded := map[string]*ebpf.Program{}
	for _, g := range groups {
		if g.Off != nil {
			rep.OffErr(g.Part, g.Off)
			continue
		}
		got, gerr := p.loadGroup(g)
		for fb := g.Fallback; gerr != nil && fb != nil; fb = fb.Fallback {
			var ferr error
			alt := *fb
			alt.Part = g.Part
			if got, ferr = p.loadGroup(alt); ferr == nil {
				g.Progs, g.Via, gerr = fb.Progs, fmt.Sprintf("%s (%v)", fb.Via, gerr), nil
				break
			}
			gerr = fmt.Errorf("%w; and %s: %v", gerr, fb.Via, ferr)
		}
		if gerr != nil {
			if g.Required {
				CloseAll(loaded)
				return nil, gerr
			}
			rep.OffErr(g.Part, gerr)
			continue
		}
		for i, name := range g.Progs {
			loaded[name] = got[i]
		}
		rep.On(g.Part, g.Via)
	}
	return loaded, nil
}

// loadGroup loads g's programs (and checks Attach), or none.
func (p *Programs) loadGroup(g Group) ([]*ebpf.Program, error) {
	var got []*ebpf.Program
	var gerr error
	for _, name := range g.Progs {
		prog, err := p.Load(name, string(g.Part))
		if err != nil {
			gerr = err
			break
		}
		got = append(got, prog)
	}
	if gerr == nil && g.Attach != nil {
		last := g.Progs[len(g.Progs)-1]
		if err := g.Attach(got[len(got)-1]); err != nil {
			gerr = fmt.Errorf("program %s (%s): %w", last, g.Part, err)
		}
	}
	if gerr != nil {
		for _, prog := range got {
			prog.Close()
		}
		return nil, gerr
	}
	return got, nil
}

// CloseAll closes the programs and empties the map.
func CloseAll(progs map[string]*ebpf.Program) {
	for name, prog := range progs {
		prog.Close()
		delete(progs, name)
	}
}

// AssignPrograms sets every *ebpf.Program field of the struct dst points
// to from progs by its `ebpf:"name"` tag (nil where progs has none), as
// bpf2go's generated structs are tagged.
func AssignPrograms(progs map[string]*ebpf.Program, dst any) {
	v := reflect.ValueOf(dst).Elem()
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if name := f.Tag.Get("ebpf"); name != "" && f.Type == reflect.TypeFor[*ebpf.Program]() {
			v.Field(i).Set(reflect.ValueOf(progs[name]))
		}
	}
}
