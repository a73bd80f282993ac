package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Softirqd reads what the kernel's softirq threads (ksoftirqd/N) ran: the
// network receive work a CPU could not finish in the interrupted context
// (__do_softirq stops restarting when a task needs the CPU or after 2 ms)
// is left to them, and costs a wake-up and a context switch. Runs are
// their timeslices (/proc/PID/schedstat, third field), Runtime their CPU
// time.
type Softirqd struct{ pids []string }

// OpenSoftirqd finds the softirq threads.
func OpenSoftirqd() (*Softirqd, error) {
	comms, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		return nil, err
	}
	s := &Softirqd{}
	for _, c := range comms {
		b, err := os.ReadFile(c)
		if err == nil && strings.HasPrefix(string(b), "ksoftirqd/") {
			s.pids = append(s.pids, filepath.Base(filepath.Dir(c)))
		}
	}
	if len(s.pids) == 0 {
		return nil, fmt.Errorf("no ksoftirqd thread in /proc")
	}
	return s, nil
}

// Read sums the threads' timeslices and CPU time.
func (s *Softirqd) Read() (ProgStat, error) {
	var st ProgStat
	for _, pid := range s.pids {
		b, err := os.ReadFile("/proc/" + pid + "/schedstat")
		if err != nil {
			return st, err
		}
		f := strings.Fields(string(b))
		if len(f) < 3 {
			return st, fmt.Errorf("/proc/%s/schedstat: %q", pid, b)
		}
		ns, err1 := strconv.ParseUint(f[0], 10, 64)
		n, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			return st, fmt.Errorf("/proc/%s/schedstat: %q", pid, b)
		}
		st.Runtime += time.Duration(ns)
		st.Runs += n
	}
	return st, nil
}
