package podnet

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// NetNamespaces returns one nsfs path per network namespace that a process
// of the cgroups (and their descendants) lives in, the agent's own first
// (its conntrack holds the node's DNAT: kube-proxy). Processes that exit
// meanwhile are skipped. denied counts the processes whose namespace the
// agent may not open (no CAP_SYS_PTRACE over them, or not in its PID
// namespace).
func NetNamespaces(cgroups []string) (_ []string, denied int, _ error) {
	seen := map[uint64]bool{}
	var out []string
	add := func(pid string) {
		p := filepath.Join("/proc", pid, "ns", "net")
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			if errors.Is(err, fs.ErrPermission) || pid == "0" {
				denied++
			}
			return
		}
		if seen[st.Ino] {
			return
		}
		seen[st.Ino] = true
		out = append(out, p)
	}
	add("self")
	for _, root := range cgroups {
		err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // removed while we walk
				}
				return err
			}
			if !e.IsDir() {
				return nil
			}
			f, err := os.Open(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if pid := strings.TrimSpace(sc.Text()); pid != "" {
					add(pid)
				}
			}
			return nil
		})
		if err != nil {
			return nil, 0, fmt.Errorf("list network namespaces under %s: %w", root, err)
		}
	}
	return out, denied, nil
}
