package shortcut

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// MapFill is how full one map is.
type MapFill struct {
	Entries    int    `json:"entries"`
	MaxEntries uint32 `json:"max_entries"`
}

// FillNames are the maps ReadFill reports, in display order.
var FillNames = []string{"sockets", "pairs", "aliases", "unread"}

// ReadCounters reads the pinned datapath's counters.
func (p *Pinned) ReadCounters() (Counters, error) { return ReadCounters(p.Counters) }

// ReadFill counts the entries of the sockhash, the pairing records and the
// aliases and the unread-bytes records, keyed by FillNames.
func (p *Pinned) ReadFill() (map[string]MapFill, error) {
	out := make(map[string]MapFill, len(FillNames))
	for i, m := range []*ebpf.Map{p.Sockets, p.Pairs, p.Aliases, p.Unreads} {
		n, err := Entries(m)
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", FillNames[i], err)
		}
		out[FillNames[i]] = MapFill{Entries: n, MaxEntries: m.MaxEntries()}
	}
	return out, nil
}
