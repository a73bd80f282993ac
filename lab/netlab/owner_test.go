package netlab

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRunDir: RunDir removes the directories of killed runs (owner gone;
// no owner file and older than a day) and keeps live and recent ones.
func TestRunDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	// No process has pid_max's pid (pids stay below it): a gone owner.
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	gone := strings.TrimSpace(string(b))
	mk := func(name, owner string, age time.Duration) string {
		d := filepath.Join(tmp, "rd-"+name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(d, runDirOwner), []byte(owner), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		when := time.Now().Add(-age)
		if err := os.Chtimes(d, when, when); err != nil {
			t.Fatal(err)
		}
		return d
	}
	killed := mk("killed", gone, 0)
	live := mk("live", strconv.Itoa(os.Getpid()), 48*time.Hour)
	oldNoOwner := mk("old", "", 48*time.Hour)
	newNoOwner := mk("new", "", time.Hour)
	other := filepath.Join(tmp, "other-killed")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(other, runDirOwner), []byte(gone), 0o644)

	dir, err := RunDir("rd-")
	if err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]bool{killed: false, live: true, oldNoOwner: false, newNoOwner: true, other: true, dir: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: present %v, want %v", d, err == nil, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, runDirOwner)); err != nil || string(b) != strconv.Itoa(os.Getpid()) {
		t.Errorf("owner file of %s: %q, %v", dir, b, err)
	}
}
