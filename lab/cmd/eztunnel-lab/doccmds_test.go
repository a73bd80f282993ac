package main

import (
	"path/filepath"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cli/clidoc"
)

// TestDocsCommands: every `eztunnel-lab ...` command line in README.md and
// docs/*.md names a command of this binary and only flags it accepts (each
// parsed by a fresh command tree, not run).
func TestDocsCommands(t *testing.T) {
	docs, _ := filepath.Glob("../../../docs/*.md")
	invs, err := clidoc.Find("eztunnel-lab", append(docs, "../../../README.md")...)
	if err != nil {
		t.Fatal(err)
	}
	if len(invs) < 20 {
		t.Fatalf("found %d eztunnel-lab command lines in the docs: the extraction broke?", len(invs))
	}
	for _, inv := range invs {
		if err := clidoc.Check(newRoot, inv.Args); err != nil {
			t.Errorf("%s:%d: %q: %v", inv.File, inv.Line, inv.Text, err)
		}
	}
}
