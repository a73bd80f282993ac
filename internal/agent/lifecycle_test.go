package agent

import (
	"errors"
	"slices"
	"testing"
)

// TestLifecycle: stops run in the reverse order of their adds, each once
// (an early stop is not repeated), with their errors joined.
func TestLifecycle(t *testing.T) {
	var l lifecycle
	var order []string
	errB := errors.New("b failed")
	l.addFunc(func() { order = append(order, "a") })
	stopB := l.add(func() error { order = append(order, "b"); return errB })
	l.addFunc(func() { order = append(order, "c") })
	if err := stopB(); !errors.Is(err, errB) {
		t.Fatalf("early stop: %v", err)
	}
	err := l.stop()
	if want := []string{"b", "c", "a"}; !slices.Equal(order, want) {
		t.Fatalf("stopped %v, want %v", order, want)
	}
	if !errors.Is(err, errB) {
		t.Fatalf("joined errors %v, want %v among them", err, errB)
	}
	if err := l.stop(); err != nil || len(order) != 3 {
		t.Fatalf("a second stop: %v, %v", err, order)
	}
}
