package bpfsys

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// Counters are per-CPU counters summed over the CPUs, by external name
// (metrics, JSON): what every family reports.
type Counters map[string]uint64

// CounterSet names the values of one C enum of per-CPU counters, the index
// of a per-CPU array map: the one counter API of the families. Max is the
// enum's count (its EZ_..._MAX value, from bpf2go), Names the external name
// of each value; Check (each family's test) proves every value has one.
type CounterSet[E ~uint32] struct {
	Max   E
	Names map[E]string
}

// Name is c's external name (counter_<n> for a value without one).
func (s CounterSet[E]) Name(c E) string {
	if n, ok := s.Names[c]; ok {
		return n
	}
	return fmt.Sprintf("counter_%d", uint32(c))
}

// List is every name in enum order.
func (s CounterSet[E]) List() []string {
	names := make([]string, 0, s.Max)
	for c := E(0); c < s.Max; c++ {
		names = append(names, s.Name(c))
	}
	return names
}

// Get sums one counter of m.
func (s CounterSet[E]) Get(m *ebpf.Map, c E) (uint64, error) {
	sum, err := SumPerCPU(m, uint32(c))
	if err != nil {
		return 0, fmt.Errorf("read counter %s: %w", s.Name(c), err)
	}
	return sum, nil
}

// ReadInto adds every counter of m to out, by name.
func (s CounterSet[E]) ReadInto(m *ebpf.Map, out Counters) error {
	for c := E(0); c < s.Max; c++ {
		sum, err := s.Get(m, c)
		if err != nil {
			return err
		}
		out[s.Name(c)] = sum
	}
	return nil
}

// Read is every counter of m, by name.
func (s CounterSet[E]) Read(m *ebpf.Map) (Counters, error) {
	out := make(Counters, s.Max)
	return out, s.ReadInto(m, out)
}

// Check says which values below Max have no name, which names are used
// twice, and names of values the enum does not have.
func (s CounterSet[E]) Check() error {
	var errs []string
	seen := map[string]E{}
	for c := E(0); c < s.Max; c++ {
		n, ok := s.Names[c]
		if !ok || n == "" {
			errs = append(errs, fmt.Sprintf("value %d has no name", c))
			continue
		}
		if o, dup := seen[n]; dup {
			errs = append(errs, fmt.Sprintf("name %q of values %d and %d", n, o, c))
		}
		seen[n] = c
	}
	for c := range s.Names {
		if c >= s.Max {
			errs = append(errs, fmt.Sprintf("name %q for value %d, beyond the enum's %d", s.Names[c], c, s.Max))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("counter names: %v", errs)
	}
	return nil
}
