package shortcut

import (
	"fmt"
	"maps"

	"github.com/cilium/ebpf"
)

// MapFill is how full one map is.
type MapFill struct {
	Entries    int    `json:"entries"`
	MaxEntries uint32 `json:"max_entries"`
}

// FillNames are the maps ReadFill reports, in display order.
var FillNames = []string{"sockets", "pairs", "aliases", "syn_index", "unread", "cgroups"}

// ReadCounters reads the pinned datapath's counters.
// The adoption and close-reset counters are included when the datapath has them.
func (p *Pinned) ReadCounters() (Counters, error) {
	c, err := ReadCounters(p.Counters)
	if err != nil {
		return c, err
	}
	if p.AdoptCounters != nil {
		a, err := ReadAdoptCounters(p.AdoptCounters)
		if err != nil {
			return nil, err
		}
		maps.Copy(c, a)
	}
	if p.ResetCounters != nil {
		if err := readResetCounters(p.ResetCounters, c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// ReadFill counts the entries of the sockhash, the pairing records, the
// aliases, the SYN index, the unread-bytes records and the selected cgroups
// (Kubernetes mode: the selected pods), keyed by FillNames. A datapath
// pinned by a build without ez_sc_cgroups reports no "cgroups".
func (p *Pinned) ReadFill() (map[string]MapFill, error) {
	out := make(map[string]MapFill, len(FillNames))
	for i, m := range []*ebpf.Map{p.Sockets, p.Pairs, p.Aliases, p.SynIndex, p.Unreads, p.Cgroups} {
		if m == nil {
			continue
		}
		n, err := Entries(m)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", FillNames[i], err)
		}
		out[FillNames[i]] = MapFill{Entries: n, MaxEntries: m.MaxEntries()}
	}
	return out, nil
}

// PairingFill counts the entries of the maps of handshakes in flight
// (pairs, aliases, syn_index), which are LRU: at their bound a new
// handshake evicts the oldest entries instead of falling back.
func (s *Shortcut) PairingFill() (map[string]MapFill, error) {
	out := make(map[string]MapFill, 3)
	for name, m := range map[string]*ebpf.Map{"pairs": s.objs.EzScPairs, "aliases": s.objs.EzScAliases, "syn_index": s.objs.EzScSynIndex} {
		n, err := Entries(m)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", name, err)
		}
		out[name] = MapFill{Entries: n, MaxEntries: m.MaxEntries()}
	}
	return out, nil
}
