package agent

import (
	"testing"
	"time"
)

// TestReleaseBackoff: looks for switched ends back off from releaseEvery to
// releaseIdleEvery while they find nothing, and come back at once.
func TestReleaseBackoff(t *testing.T) {
	var r releaseBackoff
	if got := r.next(false); got != releaseEvery {
		t.Fatalf("first interval %s, want %s", got, releaseEvery)
	}
	for i := range releaseIdleAfter {
		if got := r.next(false); got != releaseEvery {
			t.Fatalf("quiet look %d: %s, want %s until %d quiet looks", i+1, got, releaseEvery, releaseIdleAfter)
		}
	}
	var seen []time.Duration
	for range 10 {
		seen = append(seen, r.next(false))
	}
	if seen[0] != 2*releaseEvery || seen[len(seen)-1] != releaseIdleEvery {
		t.Errorf("backing off: %v, want doubling from %s to %s", seen, 2*releaseEvery, releaseIdleEvery)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] < seen[i-1] || seen[i] > releaseIdleEvery {
			t.Errorf("backing off: %v is not monotonic up to %s", seen, releaseIdleEvery)
		}
	}
	if got := r.next(true); got != releaseEvery {
		t.Errorf("after a busy look: %s, want %s", got, releaseEvery)
	}
	if got := r.next(false); got != releaseEvery {
		t.Errorf("the quiet count did not start again: %s", got)
	}
}
