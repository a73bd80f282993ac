package bpfsys

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// SumPerCPU reads one key of a per-CPU u64 map (the datapaths' counters)
// and sums it over the CPUs.
func SumPerCPU(m *ebpf.Map, key uint32) (uint64, error) {
	var perCPU []uint64
	if err := m.Lookup(key, &perCPU); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range perCPU {
		sum += v
	}
	return sum, nil
}

// AddPerCPU adds n to one key of a per-CPU u64 map, in the first CPU's
// slot: for a counter that user space alone counts while BPF programs do
// not (a read-modify-write, racing any program that counts it too).
func AddPerCPU(m *ebpf.Map, key uint32, n uint64) error {
	var perCPU []uint64
	if err := m.Lookup(key, &perCPU); err != nil {
		return err
	}
	if len(perCPU) == 0 {
		return errors.New("per-CPU map without CPUs")
	}
	perCPU[0] += n
	return m.Update(key, perCPU, ebpf.UpdateExist)
}

// GrowPinnedCounters lets a build with more counters load over a datapath
// pinned by one with fewer (an upgrade in place): for each named per-CPU
// counter map of spec pinned in dir with fewer entries than spec declares,
// it makes a map of spec's size, copies every counter, and puts it in place
// of the pin (rename over the old pin: a reader sees the old map or the new
// one, never none). Programs still attached keep counting in the old map
// until the loader's re-attach replaces them: those counts, made after the
// copy, are lost. Maps not pinned, of another
// layout, or not smaller are left alone: the load then reuses or refuses
// them as before.
func GrowPinnedCounters(dir string, spec *ebpf.CollectionSpec, names ...string) error {
	for _, name := range names {
		ms, ok := spec.Maps[name]
		if !ok {
			return fmt.Errorf("grow counters: no map %s in the spec", name)
		}
		path := filepath.Join(dir, name)
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("grow counters: %s: %w", path, err)
		}
		err = growCounters(old, ms, path)
		old.Close()
		if err != nil {
			return fmt.Errorf("grow counters: %s: %w", path, err)
		}
	}
	return nil
}

func growCounters(old *ebpf.Map, ms *ebpf.MapSpec, path string) error {
	if old.Type() != ebpf.PerCPUArray || ms.Type != ebpf.PerCPUArray || old.KeySize() != 4 || old.ValueSize() != 8 ||
		ms.KeySize != 4 || ms.ValueSize != 8 || old.MaxEntries() >= ms.MaxEntries {
		return nil
	}
	cp := ms.Copy()
	cp.Pinning = ebpf.PinNone
	m, err := ebpf.NewMap(cp)
	if err != nil {
		return err
	}
	defer m.Close()
	for k := uint32(0); k < old.MaxEntries(); k++ {
		var v []uint64
		if err := old.Lookup(k, &v); err != nil {
			return fmt.Errorf("read counter %d: %w", k, err)
		}
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("copy counter %d: %w", k, err)
		}
	}
	tmp := path + "_grow" // bpffs refuses dots in names
	os.Remove(tmp)        // a killed earlier attempt's
	if err := m.Pin(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
