package netlab

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/vishvananda/netlink"
)

// ownerDir records which process owns each lab, so Sweep can tell a lab of
// a killed run from one in use by a concurrent run. A lab's file holds the
// owner's pid on its first line, then the resources it made outside its
// namespaces (Record), one per line.
const ownerDir = "/run/eztunnel-labs"

func claim(name string) error {
	if err := os.MkdirAll(ownerDir, 0o700); err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	path := filepath.Join(ownerDir, name)
	if _, err := os.Stat(path); err == nil {
		p, _ := readRecords(name)
		if pid, _ := strconv.Atoi(p); alive(pid) && pid != os.Getpid() {
			return fmt.Errorf("netlab: lab %q is in use by process %d", name, pid)
		}
		if err := errors.Join(undoRecords(name), sweepLab(name)); err != nil {
			return fmt.Errorf("netlab: removing leftovers of lab %q: %w", name, err)
		}
	}
	return os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
}

func release(name string) { os.Remove(filepath.Join(ownerDir, name)) }

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// staleLabs lists labs whose owner is gone, plus namespaces, links and
// cgroups named like a lab but with no owner record at all.
func staleLabs() []string {
	seen := map[string]bool{}
	var out []string
	add := func(name string) {
		if name != "" && !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	owned := map[string]bool{}
	entries, _ := os.ReadDir(ownerDir)
	for _, e := range entries {
		p, _ := readRecords(e.Name())
		pid, _ := strconv.Atoi(p)
		if alive(pid) {
			owned[e.Name()] = true
		} else {
			add(e.Name())
		}
	}
	nsEntries, _ := os.ReadDir("/run/netns")
	for _, e := range nsEntries {
		if rest, ok := strings.CutPrefix(e.Name(), Prefix+"-"); ok {
			if name, _, ok := strings.Cut(rest, "-"); ok && !owned[name] {
				add(name)
			}
		}
	}
	// Bridges (<prefix><name>br) and cgroup trees (<prefix>-<name>) of labs
	// whose namespaces are already gone.
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			if _, ok := l.(*netlink.Bridge); !ok {
				continue
			}
			if rest, ok := strings.CutPrefix(l.Attrs().Name, Prefix); ok {
				if name, ok := strings.CutSuffix(rest, "br"); ok && !owned[name] {
					add(name)
				}
			}
		}
	}
	if root, err := cgroupv2.Root(); err == nil {
		cgs, _ := os.ReadDir(root)
		for _, e := range cgs {
			if name, ok := strings.CutPrefix(e.Name(), Prefix+"-"); ok && e.IsDir() && !owned[name] {
				add(name)
			}
		}
	}
	return out
}

// RunDir makes a temporary directory for this test run's files (prefix +
// random, in os.TempDir) that names its owner, after removing the
// directories of earlier runs with that prefix that were killed (SIGKILL
// skips a TestMain's removal): those whose owner process is gone, or,
// without an owner file, older than a day. The caller removes its own.
func RunDir(prefix string) (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, runDirOwner)); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || alive(pid) {
				continue // a live run's, or not ours to judge
			}
		} else if fi, err := os.Stat(d); err != nil || time.Since(fi.ModTime()) < 24*time.Hour {
			continue
		}
		os.RemoveAll(d)
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, runDirOwner), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// runDirOwner is the file in a RunDir naming its owner's pid.
const runDirOwner = "pid"
