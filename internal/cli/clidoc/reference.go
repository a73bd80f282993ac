package clidoc

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Reference writes the Markdown reference of a command tree: each visible
// command (depth first, in cobra's order), its usage line, its description
// and a table of its own flags (hidden ones aside); the root's persistent
// flags once, as the global flags. regen is the command that rewrites the
// page, named in its header.
func Reference(root *cobra.Command, regen string) string {
	var b bytes.Buffer
	name := root.Name()
	fmt.Fprintf(&b, "# %s command-line reference\n\n", name)
	fmt.Fprintf(&b, "<!-- Generated from the %s binary's command tree; do not edit. Regenerate with: %s -->\n\n", name, regen)
	fmt.Fprintf(&b, "Generated from the binary's command tree (`%s`); a test fails when this page and the binary differ.\n\n", regen)
	b.WriteString(cell(root.Long, false) + "\n\n")
	b.WriteString("Commands:\n\n")
	walk(root, func(c *cobra.Command) {
		if c != root {
			fmt.Fprintf(&b, "- [`%s`](#%s): %s\n", c.CommandPath(), anchor(c.CommandPath()), c.Short)
		}
	})
	b.WriteString("\n## Global flags\n\nEvery command takes these.\n\n")
	table(&b, root.PersistentFlags())
	walk(root, func(c *cobra.Command) {
		if c == root {
			return
		}
		fmt.Fprintf(&b, "\n## %s\n\n", c.CommandPath())
		desc := c.Long
		if desc == "" {
			desc = c.Short
		}
		fmt.Fprintf(&b, "```\n%s\n```\n\n%s\n", c.UseLine(), cell(desc, false))
		if c.LocalNonPersistentFlags().HasAvailableFlags() {
			b.WriteString("\n")
			table(&b, c.LocalNonPersistentFlags())
		}
	})
	return b.String()
}

// walk visits c and its visible subcommands, depth first.
func walk(c *cobra.Command, f func(*cobra.Command)) {
	if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
		return
	}
	f(c)
	for _, s := range c.Commands() {
		walk(s, f)
	}
}

func table(b *bytes.Buffer, fs *pflag.FlagSet) {
	b.WriteString("| flag | type | default | meaning |\n|---|---|---|---|\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		def := f.DefValue
		switch {
		case def == "" || def == "[]":
			def = ""
		default:
			def = "`" + def + "`"
		}
		usage := f.Usage
		if f.Deprecated != "" {
			usage += " (deprecated: " + f.Deprecated + ")"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", name, cell(f.Value.Type(), true), def, cell(usage, true))
	})
}

// cell makes text one Markdown line (a table cell when inTable).
func cell(s string, inTable bool) string {
	s = strings.TrimSpace(s)
	s = strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(s)
	if inTable {
		s = strings.ReplaceAll(s, "|", `\|`)
		s = strings.Join(strings.Fields(s), " ")
	}
	return s
}

// anchor is GitHub's anchor of a heading made of words and spaces.
func anchor(h string) string {
	return strings.ReplaceAll(strings.ToLower(h), " ", "-")
}

// Flags returns "--name" of every visible flag of every visible command of
// the tree (global ones included).
func Flags(root *cobra.Command) map[string]bool {
	out := map[string]bool{}
	walk(root, func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if !f.Hidden {
				out["--"+f.Name] = true
			}
		})
		c.InheritedFlags().VisitAll(func(f *pflag.Flag) { out["--"+f.Name] = true })
	})
	return out
}

// CheckGenerated compares the page at path with want, and rewrites it
// instead when update is set.
func CheckGenerated(t testing.TB, path, want string, update bool, regen string) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: generate it with %s", err, regen)
	}
	if string(got) != want {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(want, "\n")
		for i := 0; i < len(gl) || i < len(wl); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("%s differs from what the generator writes, first at line %d:\n have: %q\n want: %q\nrun %s and commit", path, i+1, g, w, regen)
			}
		}
	}
}
