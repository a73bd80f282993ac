package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// Drain is how long an uninstall waits for accelerated sockets to close.
const Drain = 10 * time.Second

// Sweep removes what a killed earlier run left: labs whose owner is gone
// (netlab.Sweep leaves labs of live processes alone) and the bench's pins.
// Labs of other runs that cannot be removed are only reported to log: the
// bench's own lab name is claimed (and its leftovers removed) by netlab.New.
func Sweep(cfg datapath.Config, log io.Writer) error {
	if err := netlab.Sweep(); err != nil {
		fmt.Fprintf(log, "warning: leftovers of other labs not removed: %v\n", err)
	}
	if _, err := os.Stat(cfg.Dir()); err == nil {
		return datapath.Uninstall(cfg, 0)
	}
	return nil
}

// Delta returns after - before for every counter.
func Delta(before, after datapath.Counters) datapath.Counters {
	d := datapath.Counters{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// WriteJSON writes v indented to path, creating its directory.
func WriteJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
