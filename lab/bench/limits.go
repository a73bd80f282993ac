package bench

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// RaiseNofile raises this process's RLIMIT_NOFILE as far towards want as
// it may, so that the processes it starts inherit it: soft and hard to
// want (within fs.nr_open) where it holds CAP_SYS_RESOURCE, else the soft
// limit to the hard one. It returns the soft limit it got, which may be
// below want; an error only when the limits cannot be read or set at all.
func RaiseNofile(want uint64) (uint64, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	nrOpen, err := NrOpen()
	if err != nil {
		return 0, err
	}
	if want = min(want, nrOpen); lim.Max < want {
		err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: want, Max: want})
		if err == nil {
			return want, nil
		}
		if !errors.Is(err, unix.EPERM) {
			return 0, fmt.Errorf("raise RLIMIT_NOFILE to %d: %w", want, err)
		}
		want = lim.Max // raising the hard limit needs CAP_SYS_RESOURCE
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: want, Max: lim.Max}); err != nil {
		return 0, fmt.Errorf("raise RLIMIT_NOFILE from %d to %d: %w", lim.Cur, want, err)
	}
	return want, nil
}

// NrOpen is fs.nr_open: the most descriptors one process may have.
func NrOpen() (uint64, error) {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("fs.nr_open: %w", err)
	}
	return n, nil
}

// ProcRSS is the resident set of a process in bytes (procfs).
func ProcRSS(pid int) (uint64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.Stat()
	if err != nil {
		return 0, err
	}
	return uint64(st.ResidentMemory()), nil
}

// ProcRSSPeak is the largest resident set the process has had, in bytes
// (VmHWM of /proc/<pid>/status).
func ProcRSSPeak(pid int) (uint64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0, err
	}
	return st.VmHWM, nil
}

// MemAvailable is the machine's MemAvailable (/proc/meminfo) in bytes.
func MemAvailable() (uint64, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, err
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return 0, err
	}
	if mi.MemAvailableBytes == nil {
		return 0, errors.New("/proc/meminfo has no MemAvailable")
	}
	return *mi.MemAvailableBytes, nil
}
