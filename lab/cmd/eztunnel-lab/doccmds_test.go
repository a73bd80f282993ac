package main

import (
	"path/filepath"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cli/clidoc"
)

// TestDocsCommands: every `eztunnel-lab ...` command line in README.md,
// docs/*.md and docs/measurements/*.md names a command of this binary and only flags it accepts (each
// parsed by a fresh command tree, not run).
func TestDocsCommands(t *testing.T) {
	docs, _ := filepath.Glob("../../../docs/*.md")
	measurements, _ := filepath.Glob("../../../docs/measurements/*.md")
	docs = append(docs, measurements...)
	clidoc.Verify(t, "eztunnel-lab", newRoot, 20, append(docs, "../../../README.md")...)
}
