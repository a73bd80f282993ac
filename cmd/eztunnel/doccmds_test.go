package main

import (
	"path/filepath"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cli/clidoc"
)

// TestDocsCommands: every `eztunnel ...` command line in README.md,
// docs/*.md, docs/families/*.md and docs/measurements/*.md names a command of this binary and only
// flags that command accepts (each line parsed by a fresh command tree, not
// run).
func TestDocsCommands(t *testing.T) {
	docs, _ := filepath.Glob("../../docs/*.md")
	families, _ := filepath.Glob("../../docs/families/*.md")
	measurements, _ := filepath.Glob("../../docs/measurements/*.md")
	docs = append(docs, families...)
	docs = append(docs, measurements...)
	clidoc.Verify(t, "eztunnel", newRoot, 20, append(docs, "../../README.md", "../../SECURITY.md")...)
}
