package agentlog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The file stays under its bound, keeps the newest lines whole, and
// appends to what an earlier agent left.
func TestTailBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.log")
	tl, err := Open(path, 4096)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		fmt.Fprintf(tl, "line %04d %s\n", i, strings.Repeat("x", 40))
	}
	tl.Close()
	b, _ := os.ReadFile(path)
	if len(b) > 4096 || len(b) < 1024 {
		t.Fatalf("%d bytes, want between 1 KiB and the 4 KiB bound", len(b))
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if !strings.HasPrefix(lines[0], "line ") || lines[len(lines)-1] != "line 0999 "+strings.Repeat("x", 40) {
		t.Fatalf("first %q last %q: want whole lines ending with the newest", lines[0], lines[len(lines)-1])
	}
	tl, err = Open(path, 4096)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(tl, "after restart")
	tl.Close()
	if b2, _ := os.ReadFile(path); !strings.HasSuffix(string(b2), "line 0999 "+strings.Repeat("x", 40)+"\nafter restart\n") {
		t.Fatalf("a restarted agent does not append: ...%q", b2[max(0, len(b2)-80):])
	}
}
