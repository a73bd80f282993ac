// Package cgroupv2 finds the cgroup v2 hierarchy and validates cgroup paths.
package cgroupv2

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNotFound means no cgroup2 filesystem is mounted.
var ErrNotFound = errors.New("no cgroup v2 filesystem mounted (see /proc/mounts)")

// Root returns the first cgroup2 mount point listed in /proc/mounts.
func Root() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("cgroupv2: %w", err)
	}
	defer f.Close()
	return rootFrom(f)
}

func rootFrom(r io.Reader) (string, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return unescape(fields[1]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("cgroupv2: read mounts: %w", err)
	}
	return "", ErrNotFound
}

// unescape undoes the octal escapes of /proc/mounts (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Validate checks that path exists and is a directory of a cgroup v2 hierarchy.
func Validate(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("cgroup %q: %w", path, err)
	}
	switch uint32(st.Type) {
	case unix.CGROUP2_SUPER_MAGIC:
	case unix.CGROUP_SUPER_MAGIC:
		return fmt.Errorf("cgroup %q is a cgroup v1 hierarchy; eztunnel needs cgroup v2", path)
	default:
		return fmt.Errorf("cgroup %q is not in a cgroup v2 filesystem", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cgroup %q: %w", path, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("cgroup %q is not a directory", path)
	}
	return nil
}

// ID returns the cgroup's ID (the inode number of its directory), as
// bpf_get_current_cgroup_id reports it.
func ID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %q: %w", path, err)
	}
	return st.Ino, nil
}

// Descendants returns the IDs of the cgroups below path, at most depth
// levels down (a pod's containers). A cgroup that goes while it is walked
// is left out; an unreadable path gives none.
func Descendants(path string, depth int) []uint64 {
	if path == "" || depth <= 0 {
		return nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil
	}
	var ids []uint64
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sub := path + "/" + e.Name()
		if id, err := ID(sub); err == nil {
			ids = append(ids, id)
			ids = append(ids, Descendants(sub, depth-1)...)
		}
	}
	return ids
}
