package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

// installFault, set by tests, is called after every change an install makes;
// an error aborts the install there.
var installFault func(change string) error

// Install loads every family (adopting a datapath pinned by an earlier
// agent of the same schema) and attaches it to every cgroup, as one
// transaction: when any step fails, links pinned by the earlier agent get
// their programs back and nothing new stays pinned (a fresh install leaves
// no pin directory behind).
func Install(cfg Config, cgroups []string) (_ *Datapath, err error) {
	if len(cgroups) == 0 {
		return nil, errors.New("no cgroup to attach to")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := bpfsys.CheckSchema(cfg.PinRoot, Schema); err != nil {
		return nil, err
	}
	dir := cfg.Dir()
	fresh := !bpfsys.Exists(dir)
	if err := bpfsys.EnsureDir(cfg.PinRoot); err != nil {
		return nil, err
	}
	if err := bpfsys.EnsureDir(dir); err != nil {
		return nil, err
	}
	if fresh {
		defer func() {
			if err != nil {
				os.RemoveAll(dir)
				os.Remove(cfg.PinRoot)
			}
		}()
	} else if err := shortcut.MigrateFlatLinks(dir); err != nil {
		return nil, fmt.Errorf("adopt datapath in %s: %w", dir, err)
	}

	d := &Datapath{cfg: cfg}
	if d.sc, err = shortcut.Load(cfg.shortcut(), dir); err != nil {
		return nil, err
	}
	tx := &bpfsys.Tx{Fault: installFault}
	// Install order: families in the order they depend on each other.
	steps := []func() error{
		func() error { return d.sc.Attach(tx, cgroups) },
		func() error {
			devs, err := scanDevices()
			if err != nil {
				return fmt.Errorf("devices for the RST on close: %w", err)
			}
			_, _, _, err = d.sc.SyncDevices(tx, devs)
			return err
		},
		func() error {
			nss, _, err := netNamespaces(cgroups)
			if err != nil {
				return fmt.Errorf("namespaces for the RST on close: %w", err)
			}
			_, _, _, err = d.sc.SyncLoopbacks(tx, nss)
			return err
		},
	}
	for _, step := range steps {
		if err = step(); err != nil {
			if rerr := tx.Rollback(); rerr != nil {
				err = fmt.Errorf("%w (and rollback failed: %v)", err, rerr)
			}
			if cerr := d.Close(); cerr != nil {
				err = fmt.Errorf("%w (and close failed: %v)", err, cerr)
			}
			return nil, err
		}
	}
	if err := tx.Commit(); err != nil {
		d.Close()
		return nil, fmt.Errorf("commit install: %w", err)
	}
	return d, nil
}
