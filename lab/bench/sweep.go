package bench

import (
	"errors"
	"os"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// sweep removes what a killed earlier run left: labs whose owner is gone
// (netlab.Sweep leaves labs of live processes alone) and the bench's pins.
func sweep(cfg datapath.Config) error {
	errs := []error{netlab.Sweep()}
	if _, err := os.Stat(cfg.Dir()); err == nil {
		errs = append(errs, datapath.Uninstall(cfg, 0))
	}
	return errors.Join(errs...)
}
