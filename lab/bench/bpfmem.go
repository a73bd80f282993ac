package bench

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BPFMemory is the kernel memory of the BPF objects one process holds.
type BPFMemory struct {
	Maps     uint64 `json:"maps_bytes"`     // MapInfo.Memlock of every distinct map
	Programs uint64 `json:"programs_bytes"` // ProgramInfo.Memlock of every distinct program
	// MapBytes is Maps by map name (maps of one name added up).
	MapBytes map[string]uint64 `json:"map_bytes"`
}

// MB is the total in MiB.
func (m BPFMemory) MB() float64 { return float64(m.Maps+m.Programs) / (1 << 20) }

// ProcessBPFMemory sums the memlock the kernel reports for every distinct
// BPF map and program pid holds an fd of. Each fd is duplicated with
// pidfd_getfd and asked for its info (BPF_OBJ_GET_INFO_BY_FD).
func ProcessBPFMemory(pid int) (BPFMemory, error) {
	mem := BPFMemory{MapBytes: map[string]uint64{}}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return mem, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		return mem, err
	}
	seenMaps, seenProgs := map[ebpf.MapID]bool{}, map[ebpf.ProgramID]bool{}
	for _, e := range fds {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil || (target != "anon_inode:bpf-map" && target != "anon_inode:bpf-prog") {
			continue
		}
		var num int
		if _, err := fmt.Sscan(e.Name(), &num); err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, num, 0)
		if err != nil {
			continue // closed meanwhile
		}
		if target == "anon_inode:bpf-map" {
			err = addMap(fd, seenMaps, &mem)
		} else {
			err = addProgram(fd, seenProgs, &mem.Programs)
		}
		if err != nil {
			return mem, err
		}
	}
	return mem, nil
}

func addMap(fd int, seen map[ebpf.MapID]bool, mem *BPFMemory) error {
	m, err := ebpf.NewMapFromFD(fd) // owns fd
	if err != nil {
		return fmt.Errorf("bpf map fd: %w", err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		return fmt.Errorf("bpf map info: %w", err)
	}
	id, _ := info.ID()
	n, _ := info.Memlock()
	if !seen[id] {
		mem.MapBytes[info.Name] += n
	}
	addOnce(id, n, seen, &mem.Maps)
	return nil
}

func addProgram(fd int, seen map[ebpf.ProgramID]bool, total *uint64) error {
	p, err := ebpf.NewProgramFromFD(fd) // owns fd
	if err != nil {
		return fmt.Errorf("bpf program fd: %w", err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return fmt.Errorf("bpf program info: %w", err)
	}
	id, _ := info.ID()
	n, _ := info.Memlock()
	addOnce(id, n, seen, total)
	return nil
}

// addOnce adds n to total the first time id is seen (a process may hold
// several fds of one object).
func addOnce[ID comparable](id ID, n uint64, seen map[ID]bool, total *uint64) {
	if seen[id] {
		return
	}
	seen[id] = true
	*total += n
}
