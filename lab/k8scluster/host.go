package k8scluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// sysctls the cluster changes (ip_forward) or its daemons may change
// (kubelet's kernel defaults, kube-proxy's conntrack and route_localnet):
// their values before Start are recorded and written back by Cleanup.
var sysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables",
	"net/bridge/bridge-nf-call-ip6tables",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established",
	"net/netfilter/nf_conntrack_tcp_timeout_close_wait",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// ownerFile: the pid of the process running the cluster, then one
// "sysctl<TAB>path<TAB>old value" line per recorded sysctl.
func ownerFile(runDir string) string { return filepath.Join(runDir, "owner") }

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// claim makes RunDir and records this process as the cluster's owner, and
// the sysctls' current values.
func claim(runDir string, pins []string) error {
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return fmt.Errorf("k8scluster: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d\n", os.Getpid())
	for _, s := range sysctls {
		p := "/proc/sys/" + s
		if v, err := os.ReadFile(p); err == nil {
			fmt.Fprintf(&b, "sysctl\t%s\t%s\n", p, strings.TrimSpace(string(v)))
		}
	}
	// Tables iptables-nft will make for the cluster (kube-proxy, kubelet,
	// CNI, our chain): registered base chains are netfilter hooks every
	// packet of the host then passes, so Cleanup deletes them, empty.
	for _, fam := range []string{"ip", "ip6"} {
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			exists, err := netlab.NFTableExists(fam, table)
			if err != nil {
				return fmt.Errorf("k8scluster: %w", err)
			}
			if !exists {
				fmt.Fprintf(&b, "nftable\t%s\t%s\n", fam, table)
			}
		}
	}
	// bpffs becomes a shared mount, as systemd makes every mount on a real
	// node (the chart mounts it with HostToContainer propagation, which
	// containerd refuses on a private mount); Cleanup makes it private again.
	if !sharedMount(bpffs) {
		fmt.Fprintf(&b, "private\t%s\t-\n", bpffs)
	}
	for _, p := range pins {
		if !strings.HasPrefix(filepath.Clean(p), "/sys/fs/bpf/") {
			return fmt.Errorf("k8scluster: pin %q outside /sys/fs/bpf", p)
		}
		fmt.Fprintf(&b, "pin\t%s\t-\n", filepath.Clean(p))
	}
	return os.WriteFile(ownerFile(runDir), []byte(b.String()), 0o600)
}

func readOwner(runDir string) (pid int, recs [][]string) {
	f, err := os.Open(ownerFile(runDir))
	if err != nil {
		return 0, nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		if first {
			pid, _ = strconv.Atoi(strings.TrimSpace(sc.Text()))
			continue
		}
		f := strings.Split(sc.Text(), "\t")
		if len(f) == 3 && (f[0] == "sysctl" && strings.HasPrefix(f[1], "/proc/sys/") || f[0] == "pin" && strings.HasPrefix(f[1], "/sys/fs/bpf/") || f[0] == "nftable" || f[0] == "private" && f[1] == bpffs) {
			recs = append(recs, f)
		}
	}
	return pid, recs
}

const bpffs = "/sys/fs/bpf"

// sharedMount reports whether the mount at path propagates (shared:N in
// /proc/self/mountinfo).
func sharedMount(path string) bool {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 6 && f[4] == path {
			for _, opt := range f[6:] {
				if opt == "-" {
					break
				}
				if strings.HasPrefix(opt, "shared:") {
					return true
				}
			}
		}
	}
	return false
}

func (c *Cluster) setupHost(ctx context.Context) error {
	// A machine booted without systemd's bpffs mount (CI's) gets one, as
	// the agent would make it (bpfsys.EnsureDir); it stays, like the
	// agent's.
	if !bpfsys.IsBPFFS(bpffs) {
		if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount a BPF filesystem at %s: %w", bpffs, err)
		}
	}
	if err := unix.Mount("", bpffs, "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", bpffs, err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return err
	}
	// The node IP lives on an interface of its own: a real, non-loopback
	// address the node registers as InternalIP, reachable only from this
	// machine. A bridge without ports (this kernel has no dummy driver).
	d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: NodeLink}}
	if err := netlink.LinkAdd(d); err != nil {
		return fmt.Errorf("add %s: %w", NodeLink, err)
	}
	l, err := netlink.LinkByName(NodeLink)
	if err != nil {
		return err
	}
	addr, _ := netlink.ParseAddr(NodeIP + "/32")
	if err := netlink.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", NodeIP, NodeLink, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return err
	}
	// Pod traffic never leaves this machine: drop what is forwarded between
	// the pod CIDR and any device a default route uses.
	uplinks, err := defaultRouteLinks()
	if err != nil {
		return err
	}
	if err := c.iptables(ctx, "-N", fwdChain); err != nil {
		return err
	}
	for _, up := range uplinks {
		if err := c.iptables(ctx, "-A", fwdChain, "-s", PodCIDR, "-o", up, "-j", "DROP"); err != nil {
			return err
		}
		if err := c.iptables(ctx, "-A", fwdChain, "-d", PodCIDR, "-i", up, "-j", "DROP"); err != nil {
			return err
		}
	}
	return c.iptables(ctx, "-I", "FORWARD", "1", "-j", fwdChain)
}

func defaultRouteLinks() ([]string, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range routes {
		if r.Dst != nil && r.Dst.String() != "0.0.0.0/0" {
			continue
		}
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

func (c *Cluster) iptables(ctx context.Context, args ...string) error {
	out, err := sysexec.Command(ctx, "iptables", append([]string{"-w"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// SweepKilled removes what a killed run left in runDir (DefaultRunDir if
// empty) and on the host, as the next Start would: nothing when there is no
// such run, an error when its owner still runs.
func SweepKilled(runDir string) error {
	if runDir == "" {
		runDir = DefaultRunDir
	}
	if _, err := os.Stat(runDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return Cleanup(runDir)
}

// Cleanup removes everything a cluster under runDir made, whether it was
// stopped or its process was killed: processes, pods, mounts, network
// namespaces, cgroups, iptables chains, interfaces, sysctls, files. It
// refuses while the owner process is alive and is not this one.
func Cleanup(runDir string) error {
	if runDir == "" {
		runDir = DefaultRunDir
	}
	pid, recs := readOwner(runDir)
	if pid != 0 && pid != os.Getpid() && alive(pid) {
		return fmt.Errorf("k8scluster: the cluster in %s is in use by process %d", runDir, pid)
	}
	var errs []error
	// Pods first (cgroup.kill takes a whole subtree), then the daemons and
	// the shims: every process whose command line names runDir.
	killPods()
	killByCmdline(runDir)
	killPods()
	errs = append(errs, unmountUnder(runDir), removeNetns(), removeCgroups())
	errs = append(errs, removeChains())
	for _, name := range []string{BridgeLink, NodeLink} {
		if l, err := netlink.LinkByName(name); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
			}
		}
	}
	removeCNICache()
	for _, r := range recs {
		if r[0] == "pin" {
			if err := os.RemoveAll(r[1]); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if r[0] == "private" {
			if !bpfsys.IsBPFFS(r[1]) {
				continue // a run that failed before mounting it: nothing to restore
			}
			if err := unix.Mount("", r[1], "", unix.MS_PRIVATE, ""); err != nil {
				errs = append(errs, fmt.Errorf("make %s private again: %w", r[1], err))
			}
			continue
		}
		if r[0] == "nftable" {
			errs = append(errs, netlab.DeleteEmptyNFTable(r[1], r[2]))
			continue
		}
		if err := os.WriteFile(r[1], []byte(r[2]+"\n"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("restore %s: %w", r[1], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.RemoveAll(runDir); err != nil {
		return fmt.Errorf("k8scluster: remove %s: %w", runDir, err)
	}
	return nil
}

// cgroupRoots are the hierarchies where kubelet (cgroupfs driver) makes its
// kubepods tree: every mounted cgroup v1 hierarchy and the cgroup2 mount.
func cgroupRoots() []string {
	var out []string
	b, _ := os.ReadFile("/proc/self/mounts")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && (f[2] == "cgroup" || f[2] == "cgroup2") {
			out = append(out, f[1])
		}
	}
	return out
}

// killPods kills every process in a kubepods tree.
func killPods() {
	for _, root := range cgroupRoots() {
		dir := filepath.Join(root, "kubepods")
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		if os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0o644) == nil {
			continue
		}
		filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && !e.IsDir() && e.Name() == "cgroup.procs" {
				b, _ := os.ReadFile(p)
				for _, s := range strings.Fields(string(b)) {
					if pid, _ := strconv.Atoi(s); pid > 1 {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
			}
			return nil
		})
	}
	time.Sleep(200 * time.Millisecond)
}

// killByCmdline SIGKILLs every process whose argv mentions dir (the
// daemons' flags and the shims' -address all point into it).
func killByCmdline(dir string) {
	self := os.Getpid()
	for range 3 {
		found := false
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && strings.Contains(string(b), dir+"/") {
				syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		if !found {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// unmountUnder detaches every mount at or below dir, deepest first.
func unmountUnder(dir string) error {
	var errs []error
	for range 3 {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return err
		}
		var mps []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 {
				mp := unescapeMount(f[4])
				if mp == dir || strings.HasPrefix(mp, dir+"/") {
					mps = append(mps, mp)
				}
			}
		}
		if len(mps) == 0 {
			return nil
		}
		sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
		errs = errs[:0]
		for _, mp := range mps {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
			}
		}
	}
	return errors.Join(errs...)
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// removeNetns removes the pods' network namespaces (containerd names them
// cni-<uuid> under /run/netns; nothing else on this machine uses that name).
func removeNetns() error {
	var errs []error
	for _, dir := range []string{"/run/netns", "/var/run/netns"} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), "cni-") {
				continue
			}
			p := filepath.Join(dir, e.Name())
			unix.Unmount(p, unix.MNT_DETACH)
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeCgroups removes the kubepods trees, deepest first.
func removeCgroups() error {
	var errs []error
	for _, root := range cgroupRoots() {
		dir := filepath.Join(root, "kubepods")
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		var dirs []string
		filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 20; try++ {
				if err = os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond) // dying processes still in it
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// chainPrefixes: kube-proxy and kubelet make KUBE-*, the CNI plugins CNI-*,
// this package EZK8S-*.
var chainPrefixes = []string{"KUBE-", "CNI-", "EZK8S-"}

func ownedChain(name string) bool {
	for _, p := range chainPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// removeChains deletes, in iptables and ip6tables, every rule that jumps to
// an owned chain, then the owned chains.
func removeChains() error {
	var errs []error
	for _, fam := range []struct{ save, ipt string }{{"iptables-save", "iptables"}, {"ip6tables-save", "ip6tables"}} {
		for _, table := range []string{"filter", "nat", "mangle", "raw"} {
			out, err := sysexec.Command(context.Background(), fam.save, "-t", table).Output()
			if err != nil {
				continue // table absent
			}
			var chains []string
			var rules [][]string
			for _, line := range strings.Split(string(out), "\n") {
				switch {
				case strings.HasPrefix(line, ":"):
					if name := strings.Fields(line[1:])[0]; ownedChain(name) {
						chains = append(chains, name)
					}
				case strings.HasPrefix(line, "-A "):
					f := strings.Fields(line)
					if ownedChain(f[1]) {
						continue // goes with its chain
					}
					for i := 0; i+1 < len(f); i++ {
						if (f[i] == "-j" || f[i] == "-g") && ownedChain(f[i+1]) {
							rules = append(rules, f)
							break
						}
					}
				}
			}
			run := func(args ...string) {
				cmd := sysexec.Command(context.Background(), fam.ipt, append([]string{"-w", "-t", table}, args...)...)
				if out, err := cmd.CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s -t %s %s: %w: %s", fam.ipt, table, strings.Join(args, " "), err, out))
				}
			}
			for _, r := range rules {
				// iptables-save quotes comments; -D wants them unquoted.
				args := append([]string{"-D"}, unquote(r[1:])...)
				run(args...)
			}
			for _, ch := range chains {
				run("-F", ch)
			}
			for _, ch := range chains {
				run("-X", ch)
			}
		}
	}
	return errors.Join(errs...)
}

// unquote joins iptables-save's "quoted words" back into single arguments.
func unquote(f []string) []string {
	var out []string
	for i := 0; i < len(f); i++ {
		s := f[i]
		if strings.HasPrefix(s, `"`) {
			for !strings.HasSuffix(s, `"`) || len(s) == 1 {
				i++
				if i >= len(f) {
					break
				}
				s += " " + f[i]
			}
			s = strings.Trim(s, `"`)
		}
		out = append(out, s)
	}
	return out
}

// removeCNICache drops libcni's cached results for the cluster's network.
func removeCNICache() {
	ents, _ := os.ReadDir("/var/lib/cni/results")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), cniNetwork+"-") {
			os.Remove(filepath.Join("/var/lib/cni/results", e.Name()))
		}
	}
}
