package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// ErrNotInstalled means no datapath is pinned under the configured path.
var ErrNotInstalled = errors.New("no eztunnel datapath is installed")

// Pinned is a read-only view of an installed datapath, usable while no agent runs.
type Pinned struct {
	Counters *ebpf.Map
	Sockets  *ebpf.Map
	Pairs    *ebpf.Map
	Aliases  *ebpf.Map
}

// OpenPinned opens the maps of the datapath pinned under cfg.Dir().
func OpenPinned(cfg Config) (*Pinned, error) {
	if !exists(cfg.Dir()) {
		return nil, fmt.Errorf("%w at %s", ErrNotInstalled, cfg.Dir())
	}
	p := &Pinned{}
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{"ez_counters", &p.Counters}, {"ez_sockets", &p.Sockets}, {"ez_pairs", &p.Pairs}, {"ez_aliases", &p.Aliases}} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(cfg.Dir(), m.name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("open pinned map %s: %w", m.name, err)
		}
		*m.dst = mp
	}
	return p, nil
}

// Close releases the handles.
func (p *Pinned) Close() {
	for _, m := range []*ebpf.Map{p.Counters, p.Sockets, p.Pairs, p.Aliases} {
		if m != nil {
			m.Close()
		}
	}
}

// Entries counts the entries of a hash-like map by walking its keys.
func Entries(m *ebpf.Map) (int, error) {
	var n int
	key := make([]byte, m.KeySize())
	it := m.Iterate()
	var val []byte
	if m.Type() == ebpf.SockHash {
		// Sockhash values read back as socket cookies; only the count matters.
		val = make([]byte, 8)
	} else {
		val = make([]byte, m.ValueSize())
	}
	for it.Next(&key, &val) {
		n++
	}
	return n, it.Err()
}

// Uninstall stops enrolment (detaches sockops and egress from every cgroup),
// waits up to drain for accelerated connections to end, then removes the
// sk_msg program and every pin. If connections remain after drain it returns
// an error and leaves the maps pinned: dropping the sockhash would discard
// bytes still queued for those connections.
func Uninstall(cfg Config, drain time.Duration) error {
	dir := cfg.Dir()
	if !exists(dir) {
		return fmt.Errorf("%w at %s", ErrNotInstalled, dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), "link_") {
			continue
		}
		pin := filepath.Join(dir, e.Name())
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			return fmt.Errorf("open pinned link %s: %w", pin, err)
		}
		// Detach first: a pinned link lives while its pin does.
		if err := l.Unpin(); err != nil {
			l.Close()
			return fmt.Errorf("unpin %s: %w", pin, err)
		}
		l.Close()
	}

	sockets, err := ebpf.LoadPinnedMap(filepath.Join(dir, "ez_sockets"), nil)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("open pinned sockhash: %w", err)
	}
	if sockets != nil {
		defer sockets.Close()
		deadline := time.Now().Add(drain)
		for {
			n, err := Entries(sockets)
			if err != nil {
				return fmt.Errorf("count enrolled sockets: %w", err)
			}
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d sockets are still accelerated after %s; enrolment is stopped, the datapath stays pinned in %s until they close (rerun uninstall)", n, drain, dir)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if prog, err := ebpf.LoadPinnedProgram(filepath.Join(dir, "prog_ez_msg"), nil); err == nil {
			link.RawDetachProgram(link.RawDetachProgramOptions{Target: sockets.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict})
			prog.Close()
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove pins: %w", err)
	}
	// Remove the root too when nothing else (another schema) lives there.
	os.Remove(cfg.PinRoot)
	return nil
}
