// Package agentlog keeps the agent's recent log lines in a bounded file
// under /run (gone at reboot, as the pins are), for `eztunnel bugreport`:
// in a DaemonSet the container's log is the runtime's, which the bug
// report on the node cannot read.
package agentlog

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
)

// Tail is an io.Writer that appends to a file and keeps it under max
// bytes: past max, it keeps the newest half, cut at a line start.
type Tail struct {
	mu   sync.Mutex
	f    *os.File
	size int64
	max  int64
}

// Open opens (creating, appending to) the file at path, kept under max bytes.
func Open(path string, max int64) (*Tail, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Tail{f: f, size: st.Size(), max: max}, nil
}

// Write appends p (one log record) and trims the file when it passed max.
// A failure to write is not the caller's: the log goes on elsewhere.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return len(p), nil
	}
	n, err := t.f.Write(p)
	t.size += int64(n)
	if err == nil && t.size > t.max {
		t.trim()
	}
	return len(p), nil
}

// trim keeps the newest half of the file, from a line start.
func (t *Tail) trim() {
	b, err := os.ReadFile(t.f.Name())
	if err != nil {
		return
	}
	keep := b[len(b)-int(min(int64(len(b)), t.max/2)):]
	if i := bytes.IndexByte(keep, '\n'); i >= 0 {
		keep = keep[i+1:]
	}
	if err := t.f.Truncate(0); err != nil {
		return
	}
	n, _ := t.f.Write(keep) // O_APPEND: at the (new) end
	t.size = int64(n)
}

// Close closes the file; later writes are dropped.
func (t *Tail) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.f == nil {
		return nil
	}
	err := t.f.Close()
	t.f = nil
	return err
}
