// Package logbuf is a child process's output, written by the process while
// a test or benchmark reads it.
package logbuf

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer safe for concurrent Write and String. With Limit
// set it keeps only the first Limit bytes (a chatty server must not grow a
// long run's memory); later writes are dropped, and still reported written.
type Buffer struct {
	Limit int // 0: no limit

	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Limit > 0 && l.b.Len() > l.Limit {
		return len(p), nil
	}
	return l.b.Write(p)
}

// String is everything kept so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
