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

// TestReferenceFlagsCover: the flags reference (docs/reference/eztunnel-flags.md,
// generated) has a section for every visible command, and each section's
// table names every flag of that command (hidden ones aside) and none it does
// not have, read back from the page rather than from the generator, so a
// generator that drops a command or a flag cannot pass with its own output.
func TestReferenceFlagsCover(t *testing.T) {
	b, err := os.ReadFile("../../docs/reference/eztunnel-flags.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]map[string]bool{} // "eztunnel run" -> its flags
	var cur map[string]bool
	heading := regexp.MustCompile(`^## (eztunnel(?: [a-z-]+)*|Global flags)$`)
	row := regexp.MustCompile("^\\| (?:`-[a-z]`, )?`(--[a-z0-9-]+)` \\|")
	for _, line := range strings.Split(string(b), "\n") {
		if m := heading.FindStringSubmatch(line); m != nil {
			cur = map[string]bool{}
			sections[m[1]] = cur
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil && cur != nil {
			cur[m[1]] = true
		}
	}
	root := newRoot()
	want := map[string]map[string]bool{"Global flags": {}}
	root.PersistentFlags().VisitAll(func(f *pflag.Flag) { want["Global flags"]["--"+f.Name] = true })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		if c != root {
			fl := map[string]bool{}
			c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) {
				if !f.Hidden {
					fl["--"+f.Name] = true
				}
			})
			want[c.CommandPath()] = fl
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if len(want["eztunnel run"]) < 20 {
		t.Fatalf("eztunnel run has %d flags: the walk broke?", len(want["eztunnel run"]))
	}
	for cmd, flags := range want {
		got, ok := sections[cmd]
		if !ok {
			t.Errorf("the reference has no section for %q", cmd)
			continue
		}
		var missing, extra []string
		for f := range flags {
			if !got[f] {
				missing = append(missing, f)
			}
		}
		for f := range got {
			if !flags[f] {
				extra = append(extra, f)
			}
		}
		sort.Strings(missing)
		sort.Strings(extra)
		if len(missing) > 0 {
			t.Errorf("%s: flags missing from the reference: %v", cmd, missing)
		}
		if len(extra) > 0 {
			t.Errorf("%s: the reference documents flags it does not have: %v", cmd, extra)
		}
	}
	for cmd := range sections {
		if want[cmd] == nil {
			t.Errorf("the reference has a section for %q, which is no command", cmd)
		}
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
