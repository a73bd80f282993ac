package main

import (
	"flag"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cli/clidoc"
)

// RegenReference is the one command that rewrites every generated
// reference page (docs/reference/); each page names it in its header.
const RegenReference = "make reference"

var update = flag.Bool("update", false, "rewrite the generated pages under docs/reference instead of comparing them")

// TestReferenceFlags: docs/reference/eztunnel-flags.md is what the generator
// writes from this binary's command tree (`make reference` rewrites it).
func TestReferenceFlags(t *testing.T) {
	clidoc.CheckGenerated(t, "../../docs/reference/eztunnel-flags.md", clidoc.Reference(newRoot(), RegenReference), *update, RegenReference)
}
