package datapath

import (
	"fmt"
	"os"
	"time"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

// Uninstall removes an installed datapath without losing or reordering a
// byte of any established connection: it removes every family's pinned
// links (the bridge bypass's and the load balancer's, then the shortcut's:
// no socket is enrolled any more), lets each family hand its state back to
// the kernel (shortcut.Release), then removes every pin. If a family cannot
// finish within drain it returns an error and leaves the maps pinned: rerun it.
func Uninstall(cfg Config, drain time.Duration) error {
	dir := cfg.Dir()
	if !bpfsys.Exists(dir) {
		return fmt.Errorf("%w at %s", ErrNotInstalled, dir)
	}
	if err := shortcut.MigrateFlatLinks(dir); err != nil {
		return err
	}
	if err := shortcut.MigrateNames(nil, dir); err != nil {
		return err
	}
	// The families beside the shortcut first, in reverse install order
	// (their packets and sockets take the kernel path), then the shortcut's
	// links, before its state is handed back.
	for i := len(kinds) - 1; i >= 0; i-- {
		if k := kinds[i]; k.unpin != nil {
			if _, err := k.unpin(dir); err != nil {
				return fmt.Errorf("uninstall the %s: %w", k.name, err)
			}
		}
	}
	if err := bpfsys.UnpinLinks(dir); err != nil {
		return err
	}
	if err := shortcut.Release(dir, drain); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove pins: %w", err)
	}
	os.Remove(cfg.Layout().Report()) // the agent's report of what ran
	os.Remove(cfg.Layout().Log())    // its recent log
	os.Remove(cfg.Layout().LogLevel())
	os.Remove(cfg.Layout().Socket()) // a killed agent's local API
	// Remove the root too when nothing else (another schema) lives there.
	os.Remove(cfg.PinRoot)
	return nil
}
