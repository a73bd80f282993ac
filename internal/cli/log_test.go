package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// TestKlogInAgentFormat: what client-go logs through klog comes out of the
// agent's slog handler, in its format (one JSON object per line).
func TestKlogInAgentFormat(t *testing.T) {
	var buf bytes.Buffer
	old := logOutput
	logOutput = &buf
	t.Cleanup(func() { logOutput = old })
	sub := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error {
		klog.InfoS("watch restarted", "resource", "pods")
		klog.ErrorS(nil, "list failed", "resource", "services")
		klog.Flush()
		return nil
	}}
	root := Root("t", "t", "t", "dev", sub)
	root.SetArgs([]string{"x", "--log-format", "json"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), buf.String())
	}
	for i, want := range []struct{ msg, level, resource string }{{"watch restarted", "INFO", "pods"}, {"list failed", "ERROR", "services"}} {
		var m map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &m); err != nil {
			t.Fatalf("line %d is not the agent's JSON: %v\n%s", i, err, lines[i])
		}
		if m["msg"] != want.msg || m["level"] != want.level || m["resource"] != want.resource || m["logger"] != "client-go" {
			t.Errorf("line %d: %v, want msg %q level %s resource %s logger client-go", i, m, want.msg, want.level, want.resource)
		}
	}
}
