package hops

import (
	"errors"
	"fmt"
	"maps"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/naivesockmap"
)

// attached is a datapath on the node: its counters, and how to remove it.
type attached struct {
	counters func() (map[string]uint64, error)
	close    func() error
}

// attach puts datapath dp on the node (plain: nothing).
func (h *hop) attach(dp string) (*attached, error) {
	switch dp {
	case Plain:
		return &attached{counters: func() (map[string]uint64, error) { return nil, nil }, close: func() error { return nil }}, nil
	case Naive:
		nv, err := naivesockmap.Load(h.node.Lab.Managed)
		if err != nil {
			return nil, err
		}
		return &attached{counters: nv.Counters, close: nv.Close}, nil
	case Eztunnel:
		d, err := datapath.Install(h.cfg, []string{h.node.Lab.Managed})
		if err != nil {
			return nil, fmt.Errorf("install datapath: %w", err)
		}
		return &attached{counters: func() (map[string]uint64, error) {
			c, err := d.Counters()
			return map[string]uint64(c), err
		}, close: func() error {
			return errors.Join(d.Close(), datapath.Uninstall(h.cfg, bench.Drain))
		}}, nil
	}
	return nil, fmt.Errorf("unknown datapath %q", dp)
}

// run measures dp: a timed ping-echo run with the kernel's BPF statistics
// off (they cost every program run a little), then one with them on, of
// the programs dp loaded (none for plain TCP).
func (h *hop) run(dp string) (r Run, err error) {
	r = Run{Mesh: h.mesh, Datapath: dp}
	old, err := bench.ProgramIDs()
	if err != nil {
		return r, err
	}
	a, err := h.attach(dp)
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, a.close()) }()
	c0, err := a.counters()
	if err != nil {
		return r, err
	}
	if r.P50, err = h.ping(); err != nil {
		return r, err
	}
	progs, err := bench.OpenNewProgs("ez_", old)
	if err != nil {
		return r, err
	}
	defer progs.Close()
	if r.Progs, err = progs.During(func() error { _, err := h.ping(); return err }); err != nil {
		return r, err
	}
	r.RoundTrips = h.o.PingN + warmup
	c1, err := a.counters()
	if err != nil {
		return r, err
	}
	if c1 != nil {
		r.Counters = maps.Clone(c1)
		for k, v := range c0 {
			r.Counters[k] -= v
		}
	}
	return r, nil
}
