package bench

import (
	"os"
	"sync"
	"time"

	"github.com/prometheus/procfs"
)

// CPUBusy is a /proc/stat CPU line's busy seconds: every column but idle
// and iowait (softirq included: that is where most of the kernel's network
// stack runs; guest time is already counted in user).
func CPUBusy(c procfs.CPUStat) float64 {
	return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
}

// SystemBusy is the busy seconds of all CPUs since boot (CPUBusy of the
// "cpu" line).
func SystemBusy(fs procfs.FS) (float64, error) {
	st, err := fs.Stat()
	if err != nil {
		return 0, err
	}
	return CPUBusy(st.CPUTotal), nil
}

// TCPMemPages is the kernel's TCP socket memory in pages (sockstat "TCP:
// mem", tcp_memory_allocated): one counter for every network namespace of
// the machine.
func TCPMemPages(pfs procfs.FS) (int, error) {
	st, err := pfs.NetSockstat()
	if err != nil {
		return 0, err
	}
	for _, p := range st.Protocols {
		if p.Protocol == "TCP" && p.Mem != nil {
			return *p.Mem, nil
		}
	}
	return 0, os.ErrNotExist
}

// SockMemPeak samples TCPMemPages every 5 ms until stop is called, which
// returns the highest rise over the first sample, in bytes.
func SockMemPeak(pfs procfs.FS) (stop func() uint64, err error) {
	base, err := TCPMemPages(pfs)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	peak := base
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			if n, err := TCPMemPages(pfs); err == nil {
				mu.Lock()
				peak = max(peak, n)
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		return uint64(peak-base) * uint64(os.Getpagesize())
	}, nil
}

// Settle waits until the machine is quiet: two 100 ms windows in a row in
// which all CPUs together were busy for less than quiet (a fraction of one
// CPU's time), or until max has passed. It returns how long it waited.
// Benchmarks call it after starting or stopping agents: loading their
// programs, and the kernel's deferred freeing of an uninstalled datapath's
// maps (kworkers), would otherwise land in the next measurement.
func Settle(max time.Duration, quiet float64) (time.Duration, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, err
	}
	const window = 100 * time.Millisecond
	start := time.Now()
	prev, err := SystemBusy(fs)
	if err != nil {
		return 0, err
	}
	calm := 0
	for calm < 2 && time.Since(start) < max {
		time.Sleep(window)
		busy, err := SystemBusy(fs)
		if err != nil {
			return time.Since(start), err
		}
		if (busy-prev)/window.Seconds() < quiet {
			calm++
		} else {
			calm = 0
		}
		prev = busy
	}
	return time.Since(start), nil
}
