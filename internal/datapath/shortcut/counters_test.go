package shortcut

import "testing"

// Every value of enum ez_counter has a distinct external name.
func TestCounterNamesComplete(t *testing.T) {
	seen := map[string]bool{}
	for c := shortcutEzCounter(0); c < shortcutEzCounterEZ_C_MAX; c++ {
		n, ok := counterNames[c]
		if !ok {
			t.Errorf("counter %d has no name in counterNames", c)
		}
		if seen[n] {
			t.Errorf("counter name %q used twice", n)
		}
		seen[n] = true
	}
}
