// Package clidoc finds the command lines of a binary that Markdown documents
// show (fenced code blocks and inline code spans), so tests can check each
// against the binary's command tree: docs cannot name a subcommand or a flag
// that does not exist. Only tests import it.
package clidoc

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Invocation is one command line a document shows.
type Invocation struct {
	File string
	Line int
	Args []string // after the binary's name
	Text string
}

var span = regexp.MustCompile("`([^`]+)`")

// Find returns the invocations of binary (its base name, e.g. "eztunnel")
// in files: `binary ...`, `bin/binary ...`, `sudo bin/binary ...`.
func Find(binary string, files ...string) ([]Invocation, error) {
	var out []Invocation
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		fenced := false
		for i, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			var cands []string
			if fenced {
				cands = []string{line}
			} else {
				for _, m := range span.FindAllStringSubmatch(line, -1) {
					cands = append(cands, m[1])
				}
			}
			for _, c := range cands {
				if args, ok := parse(binary, c); ok {
					out = append(out, Invocation{File: filepath.Base(f), Line: i + 1, Args: args, Text: strings.TrimSpace(c)})
				}
			}
		}
	}
	return out, nil
}

// parse splits a command line into the binary's arguments, up to a shell
// operator or a comment; ok is false when the line does not run binary.
func parse(binary, line string) ([]string, bool) {
	fields := strings.Fields(line)
	for len(fields) > 0 && (fields[0] == "sudo" || fields[0] == "$" || fields[0] == "#" || strings.Contains(fields[0], "=") && !strings.HasPrefix(fields[0], "-")) {
		fields = fields[1:] // sudo, a prompt, VAR=value
	}
	if len(fields) == 0 {
		return nil, false
	}
	if name := fields[0]; name != binary && name != "bin/"+binary && name != "./bin/"+binary && !strings.HasSuffix(name, "/bin/"+binary) {
		return nil, false
	}
	var args []string
	for i, f := range fields[1:] {
		if i < 4 && (strings.HasSuffix(f, ":") || strings.HasPrefix(f, "(")) {
			return nil, false // a program's output ("eztunnel bench quick: median ..."), not a command
		}
		if f == "|" || f == "&&" || f == ";" || f == "#" || f == "||" || strings.HasPrefix(f, ">") || strings.HasPrefix(f, "2>") || strings.HasPrefix(f, "&") {
			break
		}
		args = append(args, strings.Trim(f, `"'`))
	}
	return args, true
}

// Check finds the command args names in a fresh tree from newRoot and
// parses its flags (nothing runs). Placeholders (<x>, ..., {a,b}, $VAR) are
// skipped, and so is a flag named without its value (prose naming it).
func Check(newRoot func() *cobra.Command, args []string) error {
	var clean []string
	for _, a := range args {
		if strings.ContainsAny(a, "<>[]{}$`") || strings.Contains(a, "...") || strings.Contains(a, "…") {
			continue
		}
		clean = append(clean, a)
	}
	root := newRoot()
	cmd, rest, err := root.Find(clean)
	if err != nil {
		return err
	}
	if cmd == root && len(clean) > 0 && !strings.HasPrefix(clean[0], "-") {
		return errors.New("no command " + clean[0])
	}
	err = cmd.ParseFlags(rest)
	if err == nil || errors.Is(err, pflag.ErrHelp) || strings.HasPrefix(err.Error(), "flag needs an argument") && len(rest) > 0 && rest[len(rest)-1] == strings.TrimPrefix(err.Error(), "flag needs an argument: ") {
		return nil
	}
	return err
}

// Verify checks every command line of binary in the Markdown files against
// the tree newRoot builds (Find, then Check), failing t for each bad one. It
// fails too when fewer than min lines are found: the extraction broke.
func Verify(t testing.TB, binary string, newRoot func() *cobra.Command, min int, files ...string) {
	t.Helper()
	invs, err := Find(binary, files...)
	if err != nil {
		t.Fatal(err)
	}
	if len(invs) < min {
		t.Fatalf("found %d %s command lines in the docs, want at least %d: the extraction broke?", len(invs), binary, min)
	}
	for _, inv := range invs {
		if err := Check(newRoot, inv.Args); err != nil {
			t.Errorf("%s:%d: %q: %v", inv.File, inv.Line, inv.Text, err)
		}
	}
}
