package bench

import (
	"fmt"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/probe"
)

// preflight checks, before a benchmark builds anything, that the datapath
// can be loaded here.
func preflight() error {
	if err := probe.Check(probe.Shortcut); err != nil {
		return err
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	return nil
}
