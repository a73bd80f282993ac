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

	"github.com/vishvananda/netlink"
)

// NetNamespaces returns one nsfs path per network namespace that a process
// of the cgroups (and their descendants) lives in, the agent's own first
// (its conntrack holds the node's DNAT: kube-proxy). Processes that exit
// meanwhile are skipped. denied counts the processes whose namespace the
// agent may not open (no CAP_SYS_PTRACE over them, or not in its PID
// namespace).
func NetNamespaces(cgroups []string) (_ []string, denied int, _ error) {
	ns, err := CgroupNetNamespaces(cgroups)
	if err != nil {
		return nil, 0, err
	}
	return append([]string{"/proc/self/ns/net"}, ns.Others...), ns.Denied, nil
}

// Namespaces are the network namespaces the processes of some cgroups live in.
type Namespaces struct {
	Self   bool     // one lives in the agent's own
	Others []string // one nsfs path per other namespace
	Denied int      // processes whose namespace the agent may not open
}

// CgroupNetNamespaces finds the network namespaces that processes of the
// cgroups (and their descendants) live in; processes that exit meanwhile
// are skipped.
func CgroupNetNamespaces(cgroups []string) (Namespaces, error) {
	var out Namespaces
	var self syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return out, fmt.Errorf("own network namespace: %w", err)
	}
	seen := map[uint64]bool{}
	add := func(pid string) {
		p := filepath.Join("/proc", pid, "ns", "net")
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			if errors.Is(err, fs.ErrPermission) || pid == "0" {
				out.Denied++
			}
			return
		}
		if seen[st.Ino] {
			return
		}
		seen[st.Ino] = true
		if st.Dev == self.Dev && st.Ino == self.Ino {
			out.Self = true
			return
		}
		out.Others = append(out.Others, p)
	}
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
			return Namespaces{}, fmt.Errorf("list network namespaces under %s: %w", root, err)
		}
	}
	return out, nil
}

// NetNsID is the id the agent's network namespace has for the namespace at
// the nsfs path p (RTM_GETNSID), what a port's NetNsID names; -1 when it
// has none (no link joins the two).
func NetNsID(p string) (int, error) {
	f, err := os.Open(p)
	if err != nil {
		return -1, err
	}
	defer f.Close()
	id, err := netlink.GetNetNsIdByFd(int(f.Fd()))
	if err != nil {
		return -1, fmt.Errorf("the id of network namespace %s: %w", p, err)
	}
	return id, nil
}
