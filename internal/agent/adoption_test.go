package agent

import (
	"testing"
	"time"
)

// TestAdoptRoundSpacing: a round of --adopt-interval waits roundCPUShare
// times the last round's CPU time after it ended; the rounds at start and
// on request do not.
func TestAdoptRoundSpacing(t *testing.T) {
	end := time.Now()
	a := &adopter{lastCPU: 2 * time.Second, lastEnd: end}
	if a.due("interval", end.Add(30*time.Second)) {
		t.Fatal("an interval round 30 s after a round of 2 s of CPU: started, want it postponed to 40 s")
	}
	if !a.due("interval", end.Add(roundCPUShare*2*time.Second)) {
		t.Fatal("an interval round 40 s after a round of 2 s of CPU: postponed")
	}
	for _, why := range []string{"start", "request"} {
		if !a.due(why, end) {
			t.Fatalf("a %s round: postponed", why)
		}
	}
	if !(&adopter{}).due("interval", time.Now()) {
		t.Fatal("the first interval round: postponed")
	}
}
