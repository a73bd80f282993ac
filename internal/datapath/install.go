package datapath

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Install loads the datapath (adopting a pinned one of the same schema) and
// attaches it to every cgroup. When it installs fresh and any step fails,
// every pin it made is removed again: nothing is left half-attached.
func Install(cfg Config, cgroups []string) (*Datapath, error) {
	if len(cgroups) == 0 {
		return nil, errors.New("no cgroup to attach to")
	}
	fresh := !exists(cfg.Dir())
	d, err := Load(cfg)
	if err != nil {
		return nil, err
	}
	steps := []func() error{d.attachNAT}
	for _, cg := range cgroups {
		steps = append(steps, func() error { return d.Attach(cg) })
	}
	for _, step := range steps {
		if err := step(); err != nil {
			d.Close()
			if fresh {
				if uerr := Uninstall(cfg, 0); uerr != nil {
					err = fmt.Errorf("%w (and cleanup failed: %v)", err, uerr)
				}
			}
			return nil, err
		}
	}
	return d, nil
}

// AgePairs deletes pairing records that can no longer complete: handshakes
// never claimed and ambiguous records, and unclaimed aliases, older than maxAge. Claimed and paired
// records belong to live connections and are removed by the datapath itself.
func (d *Datapath) AgePairs(maxAge time.Duration) (int, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	now := uint64(ts.Nano())
	var (
		key          shortcutEzConnKey
		val          shortcutEzPair
		stale        []shortcutEzConnKey
		staleAliases []shortcutEzConnKey
	)
	it := d.objs.EzPairs.Iterate()
	for it.Next(&key, &val) {
		st := shortcutEzPairState(val.State)
		old := now > val.CreatedNs && now-val.CreatedNs > uint64(maxAge)
		if old && (st == shortcutEzPairStateEZ_PAIR_SYN || st == shortcutEzPairStateEZ_PAIR_CLAIMING || st == shortcutEzPairStateEZ_PAIR_AMBIGUOUS) {
			stale = append(stale, key)
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("walk pairing records: %w", err)
	}
	// Aliases of handshakes whose client never claimed them.
	var alias shortcutEzAlias
	ait := d.objs.EzAliases.Iterate()
	for ait.Next(&key, &alias) {
		if now > alias.CreatedNs && now-alias.CreatedNs > uint64(maxAge) {
			staleAliases = append(staleAliases, key)
		}
	}
	if err := ait.Err(); err != nil {
		return 0, fmt.Errorf("walk aliases: %w", err)
	}
	n, err := deleteKeys(d.objs.EzPairs, stale)
	if err != nil {
		return n, err
	}
	m, err := deleteKeys(d.objs.EzAliases, staleAliases)
	return n + m, err
}

func deleteKeys(m *ebpf.Map, keys []shortcutEzConnKey) (int, error) {
	n := 0
	for i := range keys {
		if err := m.Delete(&keys[i]); err == nil {
			n++
		} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, err
		}
	}
	return n, nil
}
