package netlab

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"
)

// killCgroupTree SIGKILLs every process in the cgroup tree and waits briefly
// for the cgroups to empty.
func killCgroupTree(root string) {
	// cgroup.kill (5.14+) kills the whole subtree at once.
	if err := os.WriteFile(filepath.Join(root, "cgroup.kill"), []byte("1"), 0); err != nil {
		walkProcs(root, func(pid int) { syscall.Kill(pid, syscall.SIGKILL) })
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		n := 0
		walkProcs(root, func(int) { n++ })
		if n == 0 && !populated(root) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// populated reports cgroup.events' "populated 1" of root (its subtree
// included). cgroup.procs stops listing a killed process once its last
// thread has begun to exit (signal->live is 0: css_task_iter skips dying
// leaders without live threads), before its threads leave the cgroup in
// cgroup_exit; until they have, rmdir fails with EBUSY.
func populated(root string) bool {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.events"))
	return err == nil && bytes.Contains(b, []byte("populated 1"))
}

func walkProcs(root string, fn func(pid int)) {
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range bytes.Fields(b) {
			if pid, err := strconv.Atoi(string(f)); err == nil {
				fn(pid)
			}
		}
		return nil
	})
}

// removeCgroupTree removes cgroup directories deepest first.
func removeCgroupTree(root string) error {
	var dirs []string
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	deadline := time.Now().Add(2 * time.Second)
	for _, d := range dirs {
		err := os.Remove(d)
		// Threads still exiting keep it busy (populated) after
		// cgroup.procs is empty (populated), also in a tree not
		// killed here first: a bounded wait, then the error.
		for errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			err = os.Remove(d)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// KillCgroupTree SIGKILLs every process in the cgroup tree root and waits
// briefly for it to empty.
//
// Use it only for cgroups that are removed next. On Linux 6.18, a process
// started later with CLONE_INTO_CGROUP into a cgroup that cgroup.kill has
// killed is SIGKILLed at once; one moved there by a write to cgroup.procs
// is not (lab/bench/meshmatrix kills process by process for that reason).
func KillCgroupTree(root string) { killCgroupTree(root) }
