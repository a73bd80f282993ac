package bpftest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// helpersMarker ends the part of a family's program file that defines its
// maps and configuration; the helper headers are included after it.
const helpersMarker = "/* Helpers (headers): they use the maps above. */\n"

// TestHeadersStandAlone compiles every header under bpf/ on its own, after
// its family's maps (the part of <family>.bpf.c before helpersMarker, which
// defines them and holds no program): each must include what it needs,
// whatever the order its users include it in. And no header holds a SEC():
// programs and maps are defined in <family>.bpf.c only.
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
	dir := t.TempDir()
	for _, h := range headers {
		text, err := os.ReadFile(h)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(text, []byte("SEC(")); i >= 0 {
			line := 1 + bytes.Count(text[:i], []byte("\n"))
			t.Errorf("%s:%d holds a SEC(): programs and maps belong in the family's .bpf.c", h, line)
		}
		// The translation unit: the family's maps, then the header.
		fam := filepath.Base(filepath.Dir(h))
		unit := ""
		if prog, err := os.ReadFile(filepath.Join(root, fam, fam+".bpf.c")); err == nil {
			if i := bytes.Index(prog, []byte(helpersMarker)); i >= 0 {
				unit = string(prog[:i])
			}
		}
		abs, err := filepath.Abs(h)
		if err != nil {
			t.Fatal(err)
		}
		src := filepath.Join(dir, fam+"-"+filepath.Base(h)+".c")
		if err := os.WriteFile(src, []byte(unit+"#include \""+abs+"\"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		// Unused static inline helpers are normal in a header alone.
		cmd := sysexec.Command(context.Background(), "clang-19", "-fsyntax-only", "-target", "bpfel", "-mcpu=v3", "-Wall", "-Werror", "-Wno-unused-function",
			"-I", filepath.Join(root, "include"), "-I", root, src)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s does not compile after its family's maps: %v\n%s", h, err, out)
		}
	}
}
