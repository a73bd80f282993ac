package main

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestREADMEFlags: README's table of `eztunnel run` flags names every flag
// of the command (hidden ones aside) and no flag it does not have, so the
// table cannot drift from the binary.
func TestREADMEFlags(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	row := regexp.MustCompile("(?m)^\\| (`--[a-z0-9-]+`(?:, `--[a-z0-9-]+`)*) \\|")
	flag := regexp.MustCompile("`(--[a-z0-9-]+)`")
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		for _, f := range flag.FindAllStringSubmatch(m[1], -1) {
			documented[f[1]] = true
		}
	}
	if len(documented) < 10 {
		t.Fatalf("found %d flags in README's table: the table's format changed?", len(documented))
	}
	root := newRoot()
	run, _, err := root.Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	add := func(f *pflag.Flag) {
		if !f.Hidden {
			have["--"+f.Name] = true
		}
	}
	run.LocalFlags().VisitAll(add)
	root.PersistentFlags().VisitAll(add)
	var missing, extra []string
	for f := range have {
		if !documented[f] {
			missing = append(missing, f)
		}
	}
	for f := range documented {
		if !have[f] {
			extra = append(extra, f)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("`eztunnel run` flags missing from README's table: %v", missing)
	}
	if len(extra) > 0 {
		t.Errorf("README's table documents flags `eztunnel run` does not have: %v", extra)
	}
}

// TestFlagUsageNoBackquotes: pflag takes a back-quoted word of a usage as the
// flag's value name (`--adopt eztunnel adopt`); no flag of any command has one.
func TestFlagUsageNoBackquotes(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage has a back quote, which pflag shows as the value name: %q", c.CommandPath(), f.Name, f.Usage)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot())
}
