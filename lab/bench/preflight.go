// Package bench holds what both benchmark harnesses share: the preflight,
// the sweep of leftovers, the datapath's own memory, and table formatting.
// `bench quick` and `bench memory` live in lab/bench/quick, `bench lab` in
// lab/bench/mesh.
package bench

import (
	"fmt"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// Preflight checks, before a benchmark builds anything, that the datapath
// can be loaded here.
func Preflight() error {
	if err := bpfsys.Check(datapath.Requirements()); err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	return nil
}
