package shortcut

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// AgePairs deletes pairing records that can no longer complete: handshakes
// never claimed and ambiguous records, unclaimed aliases, and SYN index
// entries (a handshake that never completed: a scan), and connection index
// entries of ends that never paired, older than maxAge (those at most once
// every maxAge).
// Claimed and paired records belong to live connections and are removed by
// the datapath itself.
func (d *Shortcut) AgePairs(maxAge time.Duration) (int, error) {
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
	it := d.objs.EzScPairs.Iterate()
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
	ait := d.objs.EzScAliases.Iterate()
	for ait.Next(&key, &alias) {
		if now > alias.CreatedNs && now-alias.CreatedNs > uint64(maxAge) {
			staleAliases = append(staleAliases, key)
		}
	}
	if err := ait.Err(); err != nil {
		return 0, fmt.Errorf("walk aliases: %w", err)
	}
	// SYN index entries: the server's ESTABLISHED removes its own; one of a
	// handshake that never completed stays until here. Poisoned entries
	// (created_ns 0) age at once.
	var (
		ix         shortcutEzSynIndex
		staleIndex []shortcutEzSynIndex
	)
	iit := d.objs.EzScSynIndex.Iterate()
	for iit.Next(&ix, &alias) {
		if now > alias.CreatedNs && now-alias.CreatedNs > uint64(maxAge) {
			staleIndex = append(staleIndex, ix)
		}
	}
	if err := iit.Err(); err != nil {
		return 0, fmt.Errorf("walk SYN index: %w", err)
	}
	// Their proofs first (an LRU: one left behind is only evicted later).
	if _, err := deleteKeys(d.objs.EzScProofs, stale); err != nil {
		return 0, err
	}
	n, err := deleteKeys(d.objs.EzScPairs, stale)
	if err != nil {
		return n, err
	}
	m, err := deleteKeys(d.objs.EzScAliases, staleAliases)
	if err != nil {
		return n + m, err
	}
	k, err := deleteKeys(d.objs.EzScSynIndex, staleIndex)
	if err != nil {
		return n + m + k, err
	}
	// The index holds every end (two a connection): it is walked once
	// every maxAge, not at every call (the agent calls every maxAge/4),
	// so an unpaired end's entry goes between maxAge and twice that after
	// it was written.
	if d.indexPruned != 0 && now-d.indexPruned < uint64(maxAge) {
		return n + m + k, nil
	}
	j, err := d.pruneConnIndex(now, maxAge)
	if err == nil {
		d.indexPruned = now
	}
	return n + m + k + j, err
}

// pruneConnIndex deletes connection index entries of ends that never paired
// (an adoption aborted where no callback runs again): no unread record,
// older than maxAge. The datapath deletes every other entry itself.
func (d *Shortcut) pruneConnIndex(now uint64, maxAge time.Duration) (int, error) {
	return pruneIndex(d.objs.EzScIndex, d.objs.EzScUnreads, now, maxAge)
}

// pruneIndex is pruneConnIndex on the maps index and unreads. Both are
// read in batches (BPF_MAP_LOOKUP_BATCH, entryBatch entries a syscall):
// first the keys of every unread record, sorted, then the index, each old
// entry's record looked for among those keys. A walk of one key and one
// lookup a syscall, and a lookup of the record for every old entry (three
// syscalls an end, each tick of the pair aging) was most of an idle
// agent's CPU at 300k connections (docs/measurements/benchmarks.md,
// "Scale"). An entry whose record is not among the keys read first is
// looked up again, entry and record, before it is deleted: an entry written
// again or a record created meanwhile keeps it.
func pruneIndex(index, unreads *ebpf.Map, now uint64, maxAge time.Duration) (int, error) {
	paired := make([]uint64, 0, unreads.MaxEntries()/8)
	if err := batchWalk(unreads, func(k *uint64, _ *shortcutEzUnread) { paired = append(paired, *k) }); err != nil {
		return 0, fmt.Errorf("read ez_sc_unreads: %w", err)
	}
	slices.Sort(paired)
	var stale []uint64
	err := batchWalk(index, func(cookie *uint64, ix *shortcutEzConnIndex) {
		if now <= ix.CreatedNs || now-ix.CreatedNs <= uint64(maxAge) {
			return
		}
		ukey, _ := ix.unreadKey(*cookie)
		if _, ok := slices.BinarySearch(paired, ukey); !ok {
			stale = append(stale, *cookie)
		}
	})
	if err != nil {
		return 0, fmt.Errorf("walk connection index: %w", err)
	}
	var (
		u    shortcutEzUnread
		ix   shortcutEzConnIndex
		gone []uint64
	)
	for _, cookie := range stale {
		if err := index.Lookup(&cookie, &ix); errors.Is(err, ebpf.ErrKeyNotExist) {
			continue // the end closed meanwhile
		} else if err != nil {
			return 0, fmt.Errorf("read ez_sc_index: %w", err)
		}
		if now <= ix.CreatedNs || now-ix.CreatedNs <= uint64(maxAge) {
			continue // written again meanwhile
		}
		ukey, _ := ix.unreadKey(cookie)
		if err := unreads.Lookup(&ukey, &u); errors.Is(err, ebpf.ErrKeyNotExist) {
			gone = append(gone, cookie)
		} else if err != nil {
			return 0, fmt.Errorf("read ez_sc_unreads: %w", err)
		}
	}
	return deleteKeys(index, gone)
}

func deleteKeys[K any](m *ebpf.Map, keys []K) (int, error) {
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
