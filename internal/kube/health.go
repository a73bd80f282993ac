package kube

import (
	"sync"
	"time"
)

// Health is the pod watch's state as `eztunnel status` shows it: whether
// it listed once, when the API last answered and last failed.
type Health struct {
	Synced      bool      `json:"synced"`               // pods and namespaces listed once
	LastOK      time.Time `json:"last_ok,omitzero"`     // the last list or watch the API answered
	LastEvent   time.Time `json:"last_event,omitzero"`  // the last pod or namespace change seen
	Errors      uint64    `json:"errors"`               // lists and watches that failed
	LastError   string    `json:"last_error,omitempty"` // the last of them
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// Healthy: listed, and the API answered after its last failure.
func (h Health) Healthy() bool {
	return h.Synced && (h.LastErrorAt.IsZero() || h.LastOK.After(h.LastErrorAt))
}

// healthLog records a watch's Health; its methods are safe for concurrent use.
type healthLog struct {
	mu sync.Mutex
	h  Health
}

// call records the outcome of a list or a watch and returns err.
func (l *healthLog) call(err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.h.Errors++
		l.h.LastError, l.h.LastErrorAt = err.Error(), time.Now()
	} else {
		l.h.LastOK = time.Now()
	}
	return err
}

func (l *healthLog) event() {
	l.mu.Lock()
	l.h.LastEvent = time.Now()
	l.mu.Unlock()
}

func (l *healthLog) synced() {
	l.mu.Lock()
	l.h.Synced = true
	l.mu.Unlock()
}

func (l *healthLog) get() Health {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h
}
