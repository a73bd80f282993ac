package shortcut

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// ErrNotInstalled means no datapath is pinned under the configured path.
var ErrNotInstalled = errors.New("no eztunnel datapath is installed")

// ErrPartial means an uninstall stopped part way (applications had not read
// what was redirected to them within the drain time): the datapath stays
// pinned, enrolment stopped; running it again finishes it.
var ErrPartial = errors.New("uninstall not finished")

// Pinned is a read-only view of an installed datapath, usable while no agent runs.
type Pinned struct {
	Counters *ebpf.Map
	Sockets  *ebpf.Map
	Pairs    *ebpf.Map
	Aliases  *ebpf.Map
	SynIndex *ebpf.Map // handshakes in flight by what the SYN-ACK shows; nil when pinned without it
	Unreads  *ebpf.Map // per paired connection: redirected bytes not read yet
	Cgroups  *ebpf.Map // selected cgroups (Kubernetes mode); nil when pinned by a build without it
	// AdoptCounters: adoption's counters; nil when pinned by a build without adoption.
	AdoptCounters *ebpf.Map
	ResetCounters *ebpf.Map // nil: pinned by a build without RST on close
	Index         *ebpf.Map // the connection index; nil: pinned by a build without it
}

// OpenPinned opens the maps of the datapath pinned under dir.
func OpenPinned(dir string) (*Pinned, error) {
	if !bpfsys.Exists(dir) {
		return nil, fmt.Errorf("%w at %s", ErrNotInstalled, dir)
	}
	p := &Pinned{}
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{shortcutMapEzScCounters, &p.Counters}, {shortcutMapEzScSockets, &p.Sockets}, {shortcutMapEzScPairs, &p.Pairs}, {shortcutMapEzScAliases, &p.Aliases}, {shortcutMapEzScUnreads, &p.Unreads}} {
		mp, err := ebpf.LoadPinnedMap(mapPin(dir, m.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", m.name, err)
		}
		*m.dst = mp
	}
	if si, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScSynIndex), &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
		p.SynIndex = si
	}
	cg, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScCgroups), &ebpf.LoadPinOptions{ReadOnly: true})
	if err == nil {
		p.Cgroups = cg
	}
	ac, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScAdoptCounters), &ebpf.LoadPinOptions{ReadOnly: true})
	if err == nil {
		p.AdoptCounters = ac
	}
	if rc, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScResetCounters), &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
		p.ResetCounters = rc
	}
	if ix, err := ebpf.LoadPinnedMap(mapPin(dir, shortcutMapEzScIndex), &ebpf.LoadPinOptions{ReadOnly: true}); err == nil {
		p.Index = ix
	}
	return p, nil
}

// Close releases the handles.
func (p *Pinned) Close() {
	for _, m := range []*ebpf.Map{p.Counters, p.Sockets, p.Pairs, p.Aliases, p.SynIndex, p.Unreads, p.Cgroups, p.AdoptCounters, p.ResetCounters, p.Index} {
		if m != nil {
			m.Close()
		}
	}
}

// Entries counts the entries of a hash-like map: a hash map a batch of
// entries a syscall (BPF_MAP_LOOKUP_BATCH: 4,096 entries at once, the
// kernel's bucket walk does not lose its place), a sockhash (no batch
// operations) by its keys alone (BPF_MAP_GET_NEXT_KEY, no lookup: a
// sockhash value reads back as the socket's cookie). A key walk that keeps
// losing its place while the datapath deletes keys (ErrIterationAborted:
// the agent's pair aging deletes thousands of a scan's records at once) is
// walked again, a few times.
func Entries(m *ebpf.Map) (n int, err error) {
	if batchable(m.Type()) {
		n, err = batchEntries(m)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return n, err
		}
	}
	for range 5 {
		if n, err = walkKeys(m); !errors.Is(err, ebpf.ErrIterationAborted) {
			return n, err
		}
	}
	return n, err
}

// batchable: the map types whose batch lookup the kernel implements
// (the hash maps; arrays are never counted here).
func batchable(t ebpf.MapType) bool {
	return t == ebpf.Hash || t == ebpf.LRUHash
}

// entryBatch is how many entries one batch lookup reads.
const entryBatch = 4096

// batchEntries counts m's entries entryBatch at a time.
func batchEntries(m *ebpf.Map) (int, error) {
	// Slices of fixed-size byte arrays: one element a key or value, read
	// in place (no copy).
	buf := func(size uint32) any {
		t := reflect.SliceOf(reflect.ArrayOf(int(size), reflect.TypeFor[byte]()))
		return reflect.MakeSlice(t, entryBatch, entryBatch).Interface()
	}
	keys, vals := buf(m.KeySize()), buf(m.ValueSize())
	var (
		cursor ebpf.MapBatchCursor
		n      int
	)
	for {
		k, err := m.BatchLookup(&cursor, keys, vals, nil)
		n += k
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// walkKeys counts m's keys one BPF_MAP_GET_NEXT_KEY at a time.
func walkKeys(m *ebpf.Map) (int, error) {
	cur, next := make([]byte, m.KeySize()), make([]byte, m.KeySize())
	err := m.NextKey(nil, next)
	// A deleted current key restarts the walk from the first: more keys
	// than the map holds is a walk that lost its place.
	for n := 0; n <= int(m.MaxEntries()); n++ {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("get next key: %w", err)
		}
		cur, next = next, cur
		err = m.NextKey(cur, next)
	}
	return 0, ebpf.ErrIterationAborted
}

// ReadScope returns the selected cgroups (Kubernetes mode) with the sockets
// each enrolled; empty when the datapath was pinned by a build without them.
func (p *Pinned) ReadScope() (map[uint64]uint64, error) {
	if p.Cgroups == nil {
		return map[uint64]uint64{}, nil
	}
	return ReadScope(p.Cgroups)
}
