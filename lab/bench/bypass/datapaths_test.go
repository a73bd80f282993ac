package bypass

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/parts"
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

func TestCheckRefused(t *testing.T) {
	pin := "/sys/fs/bpf/eztunnel-checkrefused-test-" + strconv.Itoa(os.Getpid())
	path := datapath.Config{PinRoot: pin}.Layout().Report()
	t.Cleanup(func() { os.Remove(path) })
	if err := checkRefused(pin, nil); err != nil {
		t.Errorf("nothing refused, no report: %v", err)
	}
	if err := checkRefused(pin, []string{"ez_sc_recv"}); err == nil {
		t.Error("no report, yet the refusal checked")
	}
	var rep parts.Report
	rep.On(parts.ReadAccounting, "the gauge (ez_sc_recv: refused for a test)")
	rep.Off(parts.CloseReset, parts.CodeRefusedForTest, "program ez_sc_close_reset: refused for a test")
	if err := rep.Write(path); err != nil {
		t.Fatal(err)
	}
	if err := checkRefused(pin, []string{"ez_sc_recv", "ez_sc_close_reset"}); err != nil {
		t.Errorf("refusals in Via and Reason: %v", err)
	}
	if err := checkRefused(pin, []string{"ez_sc_recv", "ez_sc_nta"}); err == nil || !strings.Contains(err.Error(), "ez_sc_nta") {
		t.Errorf("a misspelt program: %v", err)
	}
	// A name inside a longer one is not named: ez_sc_close is not ez_sc_close_reset.
	if err := checkRefused(pin, []string{"ez_sc_close"}); err == nil {
		t.Error("a prefix of a refused program's name passed as refused")
	}
}
