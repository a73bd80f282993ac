package bench

import (
	"fmt"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// preflight checks, before a benchmark builds anything, that the datapath
// can be loaded here.
func preflight() error {
	if err := bpfsys.Check(datapath.Requirements()); err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	return nil
}
