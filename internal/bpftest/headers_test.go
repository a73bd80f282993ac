package bpftest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestHeadersStandAlone compiles every header under bpf/ on its own: each
// must include what it needs, whatever the order its users include it in.
func TestHeadersStandAlone(t *testing.T) {
	root := filepath.Join("..", "..", "bpf")
	// Every directory of bpf/ (one per datapath family, lib, the tests), as
	// it is now: no list to keep up to date. include/ holds vmlinux.h only.
	dirs, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var headers []string
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == "include" {
			continue
		}
		m, err := filepath.Glob(filepath.Join(root, d.Name(), "*.h"))
		if err != nil {
			t.Fatal(err)
		}
		headers = append(headers, m...)
	}
	// Each family's program includes its headers: a family directory
	// whose headers were not found means the walk is broken.
	for _, fam := range []string{"shortcut", "bypass", "services", "tracer", "lib"} {
		if !slices.ContainsFunc(headers, func(h string) bool { return filepath.Base(filepath.Dir(h)) == fam }) {
			t.Fatalf("no header found under %s/%s", root, fam)
		}
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
