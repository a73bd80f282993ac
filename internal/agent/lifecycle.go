package agent

import (
	"errors"
	"sync"
)

// lifecycle holds what the agent started, each with its stop, and stops
// them in the reverse order: on an error while starting, at the end of Run,
// or one early through the function add returns (a handover, the
// DaemonSet's removal). Each stop runs once; their errors are joined.
type lifecycle struct {
	mu    sync.Mutex
	stops []func() error
}

// add records the stop of what was just started and returns it, to be
// called early if need be.
func (l *lifecycle) add(stop func() error) func() error {
	var once sync.Once
	var err error
	s := func() error {
		once.Do(func() { err = stop() })
		return err
	}
	l.mu.Lock()
	l.stops = append(l.stops, s)
	l.mu.Unlock()
	return s
}

// addFunc is add for a stop without an error.
func (l *lifecycle) addFunc(stop func()) func() error {
	return l.add(func() error { stop(); return nil })
}

// stop stops everything added, the last first, and joins the errors.
func (l *lifecycle) stop() error {
	l.mu.Lock()
	stops := l.stops
	l.stops = nil
	l.mu.Unlock()
	var errs []error
	for i := len(stops) - 1; i >= 0; i-- {
		errs = append(errs, stops[i]())
	}
	return errors.Join(errs...)
}
