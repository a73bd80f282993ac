package shortcut

import (
	"maps"

	"github.com/cilium/ebpf"
)

// againstPinned is spec with the maps in pinned replaced by those (already
// loaded) maps: a copy whose specs of them take the pinned maps' sizes. A
// datapath installed with --max-sockets or --max-pairs other than the
// defaults has maps of other sizes than the object declares, and cilium/ebpf
// refuses a replacement that differs from its spec. spec is not changed.
func againstPinned(spec *ebpf.CollectionSpec, pinned map[string]*ebpf.Map) (*ebpf.CollectionSpec, *ebpf.CollectionOptions) {
	s := *spec
	s.Maps = maps.Clone(spec.Maps)
	for name, m := range pinned {
		if ms, ok := s.Maps[name]; ok {
			c := ms.Copy()
			c.MaxEntries = m.MaxEntries()
			s.Maps[name] = c
		}
	}
	return &s, &ebpf.CollectionOptions{MapReplacements: pinned}
}
