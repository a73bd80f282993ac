package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

// installFault, set by tests, is called after every change an install makes;
// an error aborts the install there.
var installFault func(change string) error

// Install loads every family cfg.Families wants (adopting a datapath
// pinned by an earlier agent of the same schema) and installs them in
// order (kinds) as one transaction: the shortcut attaches to every cgroup,
// the others take over the links an earlier agent pinned, the Service load
// balancer attaches to every cgroup too. When any step fails, links pinned
// by the earlier agent get their programs back and nothing new stays
// pinned (a fresh install leaves no pin directory behind). Once committed,
// what an earlier agent pinned of the families not running now is removed.
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

	d := &Datapath{cfg: cfg, off: map[string]error{}, removed: map[string]int{}, managed: cgroups}
	tx := &bpfsys.Tx{Fault: installFault}
	fail := func(err error) (*Datapath, error) {
		if rerr := tx.Rollback(); rerr != nil {
			err = fmt.Errorf("%w (and rollback failed: %v)", err, rerr)
		}
		if cerr := d.Close(); cerr != nil {
			err = fmt.Errorf("%w (and close failed: %v)", err, cerr)
		}
		return nil, err
	}
	if err := d.loadFamilies(tx, dir); err != nil {
		return fail(err)
	}
	d.sc = d.families[0].(shortcutFamily).Shortcut
	for _, f := range d.families {
		if err := f.Install(tx, cgroups); err != nil {
			return fail(err)
		}
	}
	d.removeUnwanted(tx, dir)
	if err := tx.Commit(); err != nil {
		d.Close()
		return nil, fmt.Errorf("commit install: %w", err)
	}
	// The loopbacks just attached are what sockops checks from now on.
	if err := d.sc.SyncCoverage(); err != nil {
		slog.Warn("RST on close: coverage of the network namespaces (retried at the next device change)", "err", err)
	}
	return d, nil
}
