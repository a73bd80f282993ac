package cgroupv2

import (
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
