package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

// AdoptReport is what one adoption round did.
type AdoptReport = shortcut.AdoptReport

// AdoptCounterNames lists the adoption counters in enum order.
func AdoptCounterNames() []string { return shortcut.AdoptCounterNames() }

// Adopt runs one adoption round for the sockets below the attached cgroups:
// it visits the network namespace of every process in them.
func (d *Datapath) Adopt(cgroups []string) (AdoptReport, error) {
	var ids []uint64
	for _, cg := range cgroups {
		id, err := cgroupv2.ID(cg)
		if err != nil {
			return AdoptReport{}, err
		}
		ids = append(ids, id)
	}
	if err := d.sc.SetAdoptHooks(ids); err != nil {
		return AdoptReport{}, err
	}
	nss, denied, err := netNamespaces(cgroups)
	if err != nil {
		return AdoptReport{}, err
	}
	rep, err := d.sc.Adopt(nss)
	rep.Denied = denied
	return rep, err
}

// netNamespaces returns one nsfs path per network namespace that a process
// of the cgroups (and their descendants) lives in, and the agent's own (its
// conntrack holds the node's DNAT: kube-proxy). Processes that exit
// meanwhile are skipped.
// denied counts processes whose namespace the agent may not open (no
// CAP_SYS_PTRACE over them, or not in its PID namespace).
// NetNamespaces lists the network namespaces (nsfs paths, the agent's
// first) the processes of the cgroup subtrees live in; denied counts the
// processes whose namespace the agent may not open.
func NetNamespaces(cgroups []string) ([]string, int, error) { return netNamespaces(cgroups) }

func netNamespaces(cgroups []string) (_ []string, denied int, _ error) {
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
