package main

import (
	"flag"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cli/clidoc"
)

var update = flag.Bool("update", false, "rewrite the generated pages under docs/reference instead of comparing them")

// TestReferenceFlags: docs/reference/kubectl-eztunnel-flags.md is what the
// generator writes from the plugin's command tree (`make reference`
// rewrites it).
func TestReferenceFlags(t *testing.T) {
	clidoc.CheckGenerated(t, "../../docs/reference/kubectl-eztunnel-flags.md", clidoc.Reference(newRoot(), "make reference"), *update, "make reference")
}
