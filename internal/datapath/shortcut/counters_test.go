package shortcut

import "testing"

// Every value of enums ez_counter, ez_adopt_counter and ez_reset_counter
// has a distinct external name, and no name is shared between them.
func TestCounterNamesComplete(t *testing.T) {
	for _, err := range []error{counters.Check(), adoptCounters.Check(), resetCounters.Check()} {
		if err != nil {
			t.Error(err)
		}
	}
	seen := map[string]bool{}
	for _, n := range CounterNames() {
		if seen[n] {
			t.Errorf("counter name %q used by two enums", n)
		}
		seen[n] = true
	}
}
