package meshmatrix

import (
	"sort"

	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/lab/bench"
)

// cpuTimes are busy and total seconds of each CPU since boot, by CPU number
// (/proc/stat "cpuN"; busy is every column but idle and iowait, softirq
// included: that is where most of the kernel's network stack runs).
type cpuTimes map[int64]struct{ busy, total float64 }

func readCPUs(fs procfs.FS) (cpuTimes, error) {
	st, err := fs.Stat()
	if err != nil {
		return nil, err
	}
	out := cpuTimes{}
	for n, c := range st.CPU {
		busy := bench.CPUBusy(c)
		out[n] = struct{ busy, total float64 }{busy, busy + c.Idle + c.Iowait}
	}
	return out, nil
}

// cpuUse is what the CPUs did between two readings: each CPU's busy
// fraction (in CPU order) and the busy seconds of all of them.
type cpuUse struct {
	busy    []float64 // per CPU, 0..1
	seconds float64   // busy CPU seconds, all CPUs
}

func (after cpuTimes) since(before cpuTimes) cpuUse {
	var u cpuUse
	ids := make([]int64, 0, len(after))
	for n := range after {
		ids = append(ids, n)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, n := range ids {
		a, b := after[n], before[n]
		db, dt := a.busy-b.busy, a.total-b.total
		f := 0.0
		if dt > 0 {
			f = db / dt
		}
		u.busy = append(u.busy, f)
		u.seconds += db
	}
	return u
}
