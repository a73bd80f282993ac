package toolbin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKey: the cache key follows every file of the tool's directory and
// its recipe, and nothing else.
func TestKey(t *testing.T) {
	repo := t.TempDir()
	dir := filepath.Join(repo, "tools", "x")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module x\n")
	write("go.sum", "a\n")
	tool := Tool{Name: "x", Pkg: "."}
	k1, err := Key(repo, tool)
	if err != nil || len(k1) != 16 {
		t.Fatalf("key %q, %v", k1, err)
	}
	if err := os.WriteFile(filepath.Join(repo, "unrelated"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if k, _ := Key(repo, tool); k != k1 {
		t.Errorf("a file outside tools/x changed the key")
	}
	write("go.sum", "b\n")
	k2, _ := Key(repo, tool)
	if k2 == k1 {
		t.Errorf("a changed go.sum kept the key %s", k1)
	}
	tool.LDFlags = "-X a=b"
	if k, _ := Key(repo, tool); k == k2 {
		t.Errorf("changed ldflags kept the key %s", k2)
	}
	if _, err := Key(repo, Tool{Name: "missing"}); err == nil {
		t.Error("a missing tool directory gave a key")
	}
	if _, err := Build(t.Context(), repo, "nosuch"); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Errorf("unknown tool: %v", err)
	}
}
