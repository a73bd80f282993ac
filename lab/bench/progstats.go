package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ProgStat is the kernel's run-time statistics of BPF programs
// (BPF_ENABLE_STATS): how many runs and their total time.
type ProgStat struct {
	Runtime time.Duration
	Runs    uint64
}

// Sub is s - o.
func (s ProgStat) Sub(o ProgStat) ProgStat {
	return ProgStat{Runtime: s.Runtime - o.Runtime, Runs: s.Runs - o.Runs}
}

// Add is s + o.
func (s ProgStat) Add(o ProgStat) ProgStat {
	return ProgStat{Runtime: s.Runtime + o.Runtime, Runs: s.Runs + o.Runs}
}

// NsPerRun is the mean time of one run (0 without runs).
func (s ProgStat) NsPerRun() float64 {
	if s.Runs == 0 {
		return 0
	}
	return float64(s.Runtime.Nanoseconds()) / float64(s.Runs)
}

// Progs are the loaded BPF programs whose names start with a prefix, held
// open so their statistics can be read between two round trips.
type Progs struct {
	progs []*ebpf.Program
	names []string
}

// OpenProgs opens every loaded program whose name starts with prefix (the
// bench's agents': a bench runs alone). Names are the kernel's (at most 15
// characters).
func OpenProgs(prefix string) (*Progs, error) { return OpenNewProgs(prefix, nil) }

// ProgramIDs are the ids of every loaded BPF program.
func ProgramIDs() (map[ebpf.ProgramID]bool, error) {
	ids := map[ebpf.ProgramID]bool{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return ids, nil
		}
		if err != nil {
			return nil, fmt.Errorf("BPF programs: %w", err)
		}
		id, ids[next] = next, true
	}
}

// OpenNewProgs is OpenProgs without the programs of old (ProgramIDs before
// the bench loaded its own): another datapath's programs on the machine
// are not the bench's.
func OpenNewProgs(prefix string, old map[ebpf.ProgramID]bool) (*Progs, error) {
	p := &Progs{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return p, nil
		}
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("BPF programs: %w", err)
		}
		id = next
		if old[id] {
			continue
		}
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := prog.Info()
		if err != nil || !strings.HasPrefix(info.Name, prefix) {
			prog.Close()
			continue
		}
		p.progs, p.names = append(p.progs, prog), append(p.names, info.Name)
	}
}

// Read sums the statistics by program name.
func (p *Progs) Read() (map[string]ProgStat, error) {
	out := map[string]ProgStat{}
	for i, prog := range p.progs {
		st, err := prog.Stats()
		if err != nil {
			return nil, fmt.Errorf("statistics of %s: %w", p.names[i], err)
		}
		out[p.names[i]] = out[p.names[i]].Add(ProgStat{Runtime: st.Runtime, Runs: st.RunCount})
	}
	return out, nil
}

// During runs run with the kernel's BPF run-time statistics on (off again
// after: they cost every program run a little) and returns what each
// program ran meanwhile, by name.
func (p *Progs) During(run func() error) (map[string]ProgStat, error) {
	on, err := EnableProgStats()
	if err != nil {
		return nil, err
	}
	defer on.Close()
	s0, err := p.Read()
	if err != nil {
		return nil, err
	}
	if err := run(); err != nil {
		return nil, err
	}
	s1, err := p.Read()
	if err != nil {
		return nil, err
	}
	out := map[string]ProgStat{}
	for name, s := range s1 {
		out[name] = s.Sub(s0[name])
	}
	return out, nil
}

// Close releases the programs.
func (p *Progs) Close() {
	for _, prog := range p.progs {
		prog.Close()
	}
	p.progs, p.names = nil, nil
}

// EnableProgStats turns the kernel's BPF run-time statistics on until the
// returned closer is closed (they cost every program a little: on only
// while measured).
func EnableProgStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("BPF run-time statistics: %w", err)
	}
	return c, nil
}

// OpenProgIDs opens the loaded programs of ids (a program gone meanwhile
// is an error), named as OpenProgs names them.
func OpenProgIDs(ids []ebpf.ProgramID) (*Progs, error) {
	p := &Progs{}
	for _, id := range ids {
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("BPF program %d: %w", id, err)
		}
		info, err := prog.Info()
		if err != nil {
			prog.Close()
			p.Close()
			return nil, fmt.Errorf("BPF program %d: %w", id, err)
		}
		p.progs, p.names = append(p.progs, prog), append(p.names, info.Name)
	}
	return p, nil
}
