package main

import (
	"context"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestAgentCarriesNoLab: the agent binary (what a DaemonSet image holds)
// links nothing of the benchmark lab and no plotting library.
func TestAgentCarriesNoLab(t *testing.T) {
	out, err := sysexec.Command(context.Background(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !strings.Contains(string(out), "github.com/eztunnel/eztunnel/internal/datapath") {
		t.Fatalf("go list -deps listed %d packages without the datapath: %q", len(deps), out)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/eztunnel/eztunnel/lab/") || strings.HasPrefix(d, "gonum.org/") {
			t.Errorf("the agent binary links %s", d)
		}
	}
}
