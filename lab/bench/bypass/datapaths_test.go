package bypass

import (
	"slices"
	"testing"
)

func TestParseDatapaths(t *testing.T) {
	got, err := ParseDatapaths([]string{"shortcut", "idle-psock", "idle"})
	if err != nil || !slices.Equal(got, []string{Bridge, Idle, IdlePsock, Shortcut}) {
		t.Errorf("got %v, %v; want the bridge first and the report's order", got, err)
	}
	if _, err := ParseDatapaths([]string{"netkit"}); err == nil {
		t.Error("an unknown datapath was accepted")
	}
}
