package clidoc

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// The checker catches what it is for: an unknown command, an unknown flag,
// a bad value; and lets placeholders, prose naming a flag and output lines pass.
func TestFindAndCheck(t *testing.T) {
	md := filepath.Join(t.TempDir(), "x.md")
	os.WriteFile(md, []byte("Run `sudo bin/tool run --port 80 | head`, not `tool --x`.\n```\n$ tool run --bogus\ntool run: 3 rounds\nVAR=1 ./bin/tool stop <name>\n```\n"), 0o644)
	invs, err := Find("tool", md)
	if err != nil {
		t.Fatal(err)
	}
	var got [][]string
	for _, inv := range invs {
		got = append(got, inv.Args)
	}
	want := [][]string{{"run", "--port", "80"}, {"--x"}, {"run", "--bogus"}, {"stop", "<name>"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("found %q, want %q", got, want)
	}
	newRoot := func() *cobra.Command {
		root := &cobra.Command{Use: "tool"}
		run := &cobra.Command{Use: "run", Run: func(*cobra.Command, []string) {}}
		run.Flags().Uint16("port", 0, "")
		root.AddCommand(run, &cobra.Command{Use: "stop", Run: func(*cobra.Command, []string) {}})
		return root
	}
	for args, ok := range map[string]bool{"run --port 80": true, "run --port": true, "stop <name>": true, "run --port x": false, "run --bogus": false, "walk": false} {
		err := Check(newRoot, strings.Fields(args))
		if (err == nil) != ok {
			t.Errorf("Check(%q) = %v, want ok %v", args, err, ok)
		}
	}
}
