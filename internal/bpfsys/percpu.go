package bpfsys

import "github.com/cilium/ebpf"

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
