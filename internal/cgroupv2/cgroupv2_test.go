package cgroupv2

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRootFromMounts(t *testing.T) {
	mounts := `tmpfs /sys/fs/cgroup tmpfs rw 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0
cgroup2 /sys/fs/cgroup/unified\040dir cgroup2 rw 0 0
`
	got, err := rootFrom(strings.NewReader(mounts))
	if err != nil || got != "/sys/fs/cgroup/unified dir" {
		t.Fatalf("rootFrom = %q, %v", got, err)
	}
	if _, err := rootFrom(strings.NewReader("proc /proc proc rw 0 0\n")); err != ErrNotFound {
		t.Fatalf("no cgroup2: err = %v, want ErrNotFound", err)
	}
}

// TestDescendants walks a directory tree as a cgroup hierarchy: every
// directory down to the depth, by inode, files left out.
func TestDescendants(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"c1", "c2/n1", "c2/n1/deep"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.procs"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]bool{}
	for _, d := range []string{"c1", "c2", "c2/n1"} {
		id, err := ID(filepath.Join(root, d))
		if err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	got := Descendants(root, 2)
	if len(got) != len(want) {
		t.Fatalf("Descendants(depth 2) = %v, want the 3 IDs of c1, c2, c2/n1 %v", got, want)
	}
	for _, id := range got {
		if !want[id] {
			t.Errorf("Descendants: %d is not one of c1, c2, c2/n1", id)
		}
	}
	if got := Descendants(filepath.Join(root, "absent"), 3); got != nil {
		t.Errorf("Descendants of a missing path = %v, want none", got)
	}
}
