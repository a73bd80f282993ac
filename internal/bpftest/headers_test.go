package bpftest

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestHeadersStandAlone compiles every header under bpf/ on its own: each
// must include what it needs, whatever the order its users include it in.
func TestHeadersStandAlone(t *testing.T) {
	root := filepath.Join("..", "..", "bpf")
	var headers []string
	for _, dir := range []string{"lib", "shortcut", "tracer", "test", "bypass", "socklb"} {
		m, err := filepath.Glob(filepath.Join(root, dir, "*.h"))
		if err != nil {
			t.Fatal(err)
		}
		headers = append(headers, m...)
	}
	if len(headers) < 20 {
		t.Fatalf("found %d headers under %s: layout changed?", len(headers), root)
	}
	if _, err := exec.LookPath("clang-19"); err != nil {
		t.Fatal("clang-19 not found (scripts/install-deps.sh installs it)")
	}
	for _, h := range headers {
		// Unused static inline helpers are normal in a header alone.
		cmd := sysexec.Command(context.Background(), "clang-19", "-fsyntax-only", "-target", "bpfel", "-mcpu=v3", "-Wall", "-Werror", "-Wno-unused-function",
			"-I", filepath.Join(root, "include"), "-I", root, "-x", "c", h)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s does not compile alone: %v\n%s", h, err, out)
		}
	}
}
