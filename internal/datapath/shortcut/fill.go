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
