package datapath

import (
	"reflect"
	"testing"

	"github.com/eztunnel/eztunnel/internal/podnet"
)

// TestCloseResetDevicesCovered: with --close-reset-devices=covered a pod's
// veth carries the close reset when its namespace is covered, or when it
// carries it already and its namespace still has an end in the sockhash
// (or before the agent's first scan: sticky); the node's loopback only
// when this namespace is covered or keeps an end. Without coverage, every
// veth and the loopback.
func TestCloseResetDevicesCovered(t *testing.T) {
	st := podnet.State{Ports: map[int]podnet.Port{
		1000: {Ifindex: 1000, Name: "covered", NetNsID: 1},
		1001: {Ifindex: 1001, Name: "kept", NetNsID: 2},
		1002: {Ifindex: 1002, Name: "pinned", NetNsID: 3},
		1003: {Ifindex: 1003, Name: "other", NetNsID: 4},
	}}
	pinned := map[int]bool{1001: true, 1002: true, loopbackIfindex: true}
	cov := func() *coverage {
		return &coverage{nsids: map[int]bool{1: true}, keep: map[int]bool{2: true, 4: true},
			pinned: func(ifx int, _ bool) bool { return pinned[ifx] }}
	}
	names := func(c *coverage) []string {
		devs, err := closeResetDevices(st, c)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range devs {
			if d.Ifindex == loopbackIfindex {
				out = append(out, "lo")
			} else if d.Ifindex >= 1000 {
				out = append(out, d.Name)
			}
		}
		return out
	}
	for _, c := range []struct {
		what string
		cov  func(*coverage)
		want []string
	}{
		// "other" keeps an end but carries no program: not attached now.
		{"covered or kept", func(*coverage) {}, []string{"covered", "kept"}},
		{"sticky", func(c *coverage) { c.sticky = true }, []string{"covered", "kept", "pinned"}},
		{"this namespace covered", func(c *coverage) { c.self = true }, []string{"lo", "covered", "kept"}},
		{"this namespace keeps an end", func(c *coverage) { c.keepSelf = true }, []string{"lo", "covered", "kept"}},
	} {
		cv := cov()
		c.cov(cv)
		if got := names(cv); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.what, got, c.want)
		}
	}
	if got := names(nil); !reflect.DeepEqual(got, []string{"lo", "covered", "kept", "pinned", "other"}) {
		t.Errorf("every device: %v", got)
	}
}
