package bpfsys

import (
	"slices"
	"strings"
	"testing"
)

// TestCounterSetCheck: Check finds a value without a name, a name used
// twice and a name beyond the enum; List and Name follow the enum.
func TestCounterSetCheck(t *testing.T) {
	type e uint32
	ok := CounterSet[e]{Max: 3, Names: map[e]string{0: "a", 1: "b", 2: "c"}}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	if got := ok.List(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("List = %v", got)
	}
	for _, c := range []struct {
		set  CounterSet[e]
		want string
	}{
		{CounterSet[e]{Max: 3, Names: map[e]string{0: "a", 2: "c"}}, "value 1 has no name"},
		{CounterSet[e]{Max: 2, Names: map[e]string{0: "a", 1: "a"}}, `name "a" of values 0 and 1`},
		{CounterSet[e]{Max: 1, Names: map[e]string{0: "a", 5: "z"}}, `name "z" for value 5`},
	} {
		if err := c.set.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%v) = %v, want %q", c.set.Names, err, c.want)
		}
	}
	if n := (CounterSet[e]{Max: 2}).Name(1); n != "counter_1" {
		t.Errorf("unnamed value: %q", n)
	}
}
