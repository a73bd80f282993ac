package datapath

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
)

// allFamilies makes kernelEnv's namespace fit for the bypass (a liberal
// conntrack window, a veth pair) and returns cfg with every family on and
// the veth's ifindex.
func allFamilies(t *testing.T, cfg Config) (Config, int) {
	t.Helper()
	// The test's thread is in its own namespace (kernelEnv): /proc/sys/net is its.
	if err := os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal", []byte("1"), 0o644); err != nil {
		t.Fatalf("the bypass needs nf_conntrack: %v", err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ezdp0"}, PeerName: "ezdp1"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName("ezdp0")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	cfg.Families = Families{Bypass: bypass.Options{On: true, Required: true}, Services: true}
	return cfg, l.Attrs().Index
}

// installAll installs every family and attaches what converges later (the
// bypass on the veth, NodePort on it), as the agent would.
func installAll(t *testing.T, cfg Config, cgs []string, ifx int) {
	t.Helper()
	d, err := Install(cfg, cgs)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Bypass() == nil || d.Services() == nil {
		t.Fatalf("families loaded: bypass %v, services %v (off: %v)", d.Bypass() != nil, d.Services() != nil, d.off)
	}
	if err := d.Bypass().AttachUplinks(ifx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.Services().SyncNodePortDevices([]int{ifx}); err != nil {
		t.Fatal(err)
	}
}

// familyOf names the family a pinned link's path (relative to the pin
// directory) belongs to.
func familyOf(pin string) string {
	for _, k := range kinds {
		if k.maps != "" && strings.HasPrefix(pin, k.maps+"/") {
			return k.name
		}
	}
	return "shortcut"
}

// An install of every family over pinned ones that fails anywhere (in the
// shortcut, the bypass's or the load balancer's link updates, the load
// balancer's new cgroup) leaves every family's pinned links with their old
// programs and pins nothing new; a successful one updates them all in
// place.
func TestInstallAllFamiliesRollsBack(t *testing.T) {
	cfg, cgs := kernelEnv(t, 3)
	cfg, ifx := allFamilies(t, cfg)
	installAll(t, cfg, cgs[:2], ifx)
	dir := cfg.Dir()
	before := pinnedLinks(t, dir)
	count := map[string]int{}
	for pin := range before {
		count[familyOf(pin)]++
	}
	// bypass: ingress and egress of the veth; services: 2 cgroups x its
	// hooks, and NodePort on the veth; shortcut: 8, the NAT learner's
	// (none where the close reset's tc program learns) and the splice
	// guard's one or two (the fentry or raw tracepoint, or the two syscall
	// events).
	if n := spliceLinks(before); count["bypass"] != 2 || count["services"] < 2*8+1 || n < 1 || count["shortcut"] != 8+natLinks(before)+n {
		t.Fatalf("pinned links per family after install: %v\n%v", count, before)
	}
	msgBefore := skMsgProgram(t, dir)

	// The bypass's and the load balancer's links get their new programs
	// at the commit (Tx.UpgradePinned), after every point below; their
	// legacy tc filters within the transaction.
	failures := []string{
		"update " + dir + "/links/cgroup/",       // the shortcut's first
		"update " + dir + "/links/tcx/",          // the shortcut's close reset
		"pin " + dir + "/services/links/cgroup/", // the load balancer's first hook on the new cgroup
	}
	if !bpfsys.UseTCX() {
		failures = []string{
			"update " + dir + "/links/cgroup/",
			"tc " + dir + "/tc/",          // the shortcut's close reset
			"tc " + dir + "/bypass/tc/",   // the bypass's first filter
			"tc " + dir + "/services/tc/", // the NodePort filter
			"pin " + dir + "/services/links/cgroup/",
		}
	}
	for _, failAt := range failures {
		installFailingAt(t, cfg, cgs, failAt)
		if after := pinnedLinks(t, dir); !mapsEqual(before, after) {
			t.Errorf("fail at %s: pinned links (link, program IDs)\nbefore %v\nafter  %v", failAt, before, after)
		}
		if got := skMsgProgram(t, dir); got != msgBefore {
			t.Errorf("fail at %s: sk_msg program %d, want the old %d", failAt, got, msgBefore)
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachCGroupSockOps, ebpf.AttachCGroupInet4Connect} {
			if n := cgroupPrograms(t, cgs[2], at); n != 0 {
				t.Errorf("fail at %s: %d %s programs left on the new cgroup", failAt, n, at)
			}
		}
	}

	install(t, cfg, cgs)
	after := pinnedLinks(t, dir)
	for pin, ids := range before {
		if strings.HasPrefix(pin, "links/netfilter/") || strings.HasPrefix(pin, "links/tracing/") {
			continue // replaced, not updated
		}
		if got := after[pin]; got[0] != ids[0] || got[1] == ids[1] {
			t.Errorf("%s (%s): link/program %v after the upgrade, was %v: want the same link with a new program", pin, familyOf(pin), got, ids)
		}
	}
	if n := cgroupPrograms(t, cgs[2], ebpf.AttachCGroupInet4Connect); n != 1 {
		t.Errorf("%d connect4 programs on the new cgroup after the upgrade, want the load balancer's", n)
	}
}

// A fresh install of every family that fails at the last family's first
// pin leaves no pin directory; one that succeeds, then an install without
// the bypass and the load balancer, removes both: their links and maps.
func TestInstallAllFamiliesFreshAndRemoval(t *testing.T) {
	cfg, cgs := kernelEnv(t, 1)
	cfg, ifx := allFamilies(t, cfg)
	installFailingAt(t, cfg, cgs, "pin "+cfg.Dir()+"/services/links/cgroup/")
	if bpfsys.Exists(cfg.PinRoot) {
		t.Fatalf("a failed fresh install left %s", cfg.PinRoot)
	}
	if n := cgroupPrograms(t, cgs[0], ebpf.AttachCGroupSockOps); n != 0 {
		t.Errorf("%d sockops programs left", n)
	}

	installAll(t, cfg, cgs, ifx)
	shortcutOnly := cfg
	shortcutOnly.Families = Families{}
	d, err := Install(shortcutOnly, cgs)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.Removed(); got["bypass"] != 2 || got["services"] != 1 {
		t.Errorf("removed %v, want the bypass's 2 links and the load balancer's 1 cgroup", got)
	}
	for pin := range pinnedLinks(t, cfg.Dir()) {
		if f := familyOf(pin); f != "shortcut" {
			t.Errorf("%s (%s) still pinned", pin, f)
		}
	}
	for _, m := range []string{bypass.MapDir, lb.MapDir} {
		if bpfsys.Exists(filepath.Join(cfg.Dir(), m)) {
			t.Errorf("%s maps still pinned", m)
		}
	}
	if n := cgroupPrograms(t, cgs[0], ebpf.AttachCGroupInet4Connect); n != 0 {
		t.Errorf("%d connect4 programs left on the cgroup", n)
	}
}

// pinShared moves the bypass's and the load balancer's pins to where builds
// before per-family directories pinned them: beside the shortcut's
// (links/tcx, tc, links/services/<cgroup id>). It returns how many it moved.
func pinShared(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	for _, fam := range []string{bypass.MapDir, lb.MapDir} {
		err := bpfsys.MovePins(nil, filepath.Join(dir, fam), func(rel string) string {
			n++
			if cg, ok := strings.CutPrefix(rel, "links/cgroup/"); ok {
				return filepath.Join(dir, "links/services", cg)
			}
			return filepath.Join(dir, rel)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// A datapath whose bypass and load balancer an earlier build pinned beside
// the shortcut's links is adopted in place: a failed install leaves every
// pin where it was with its program, a successful one moves them to their
// families' directories (the same links, new programs); uninstall removes
// either layout.
func TestAdoptSharedLinkDirs(t *testing.T) {
	cfg, cgs := kernelEnv(t, 1)
	cfg, ifx := allFamilies(t, cfg)
	installAll(t, cfg, cgs, ifx)
	dir := cfg.Dir()
	byFamily := pinnedLinks(t, dir)
	if n := pinShared(t, dir); n < 2+11+1 {
		t.Fatalf("moved %d pins", n)
	}
	shared := sharedLinks(t, dir)
	if len(shared) != len(byFamily) {
		t.Fatalf("shared layout %v, want the %d links of %v", shared, len(byFamily), byFamily)
	}

	installFailingAt(t, cfg, cgs, "move "+dir+"/links/services/") // after the bypass's pins moved
	if got := sharedLinks(t, dir); !mapsEqual(got, shared) {
		t.Errorf("after a failed install:\n got %v\nwant %v", got, shared)
	}

	installAll(t, cfg, cgs, ifx)
	after := pinnedLinks(t, dir)
	for pin, ids := range byFamily {
		if f := familyOf(pin); f != "shortcut" && (after[pin][0] != ids[0] || after[pin][1] == ids[1]) {
			t.Errorf("%s (%s): link/program %v after adoption, was %v: want the same link with a new program", pin, f, after[pin], ids)
		}
	}
	if len(after) != len(byFamily) {
		t.Errorf("links after adoption %v, want %v", after, byFamily)
	}

	pinShared(t, dir)
	if err := Uninstall(cfg, 0); err != nil {
		t.Fatal(err)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupSockOps} {
		if n := cgroupPrograms(t, cgs[0], at); n != 0 {
			t.Errorf("%d %s programs left after uninstall", n, at)
		}
	}
	if bpfsys.Exists(cfg.PinRoot) {
		t.Errorf("%s left after uninstall", cfg.PinRoot)
	}
}

// sharedLinks is pinnedLinks of the shared layout: every link under
// dir/links, with the families' directories empty of links.
func sharedLinks(t *testing.T, dir string) linkState {
	t.Helper()
	for _, fam := range []string{bypass.MapDir, lb.MapDir} {
		if ps, _ := bpfsys.PinnedLinks(filepath.Join(dir, fam)); len(ps) > 0 {
			t.Errorf("%s still has links: %v", fam, ps)
		}
	}
	return pinnedLinks(t, dir)
}

// installFailingAt installs cfg with a failure forced at the first change
// whose description starts with prefix, and fails the test unless Install
// returns that failure.
func installFailingAt(t *testing.T, cfg Config, cgs []string, prefix string) {
	t.Helper()
	var changed []string
	installFault = func(change string) error {
		changed = append(changed, change)
		if strings.HasPrefix(change, prefix) {
			return errForced
		}
		return nil
	}
	_, err := Install(cfg, cgs)
	installFault = nil
	if !errors.Is(err, errForced) {
		t.Fatalf("fail at %s: install returned %v, want the forced failure (changes %v)", prefix, err, changed)
	}
}

// withCaps runs fn on this (locked) thread with only the effective
// capabilities caps, as the agent runs in Kubernetes (the chart's BPF,
// NET_ADMIN, PERFMON), and restores them after.
func withCaps(t *testing.T, caps []uintptr, fn func()) {
	t.Helper()
	runtime.LockOSThread() // capabilities are per thread
	defer runtime.UnlockOSThread()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var saved [2]unix.CapUserData
	if err := unix.Capget(&hdr, &saved[0]); err != nil {
		t.Fatal(err)
	}
	data := saved
	data[0].Effective, data[1].Effective = 0, 0
	for _, c := range caps {
		data[c/32].Effective |= 1 << (c % 32)
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			t.Errorf("restore capabilities: %v", err)
		}
	}()
	fn()
}

// An upgrade in place of every family needs no CAP_SYS_ADMIN (opening a
// program by id would): the agent in Kubernetes has BPF, NET_ADMIN and
// PERFMON only.
func TestInstallAllFamiliesWithoutSysAdmin(t *testing.T) {
	cfg, cgs := kernelEnv(t, 1)
	cfg, ifx := allFamilies(t, cfg)
	caps := []uintptr{unix.CAP_BPF, unix.CAP_NET_ADMIN, unix.CAP_PERFMON}
	// The same parts load both times (without CAP_SYS_ADMIN the load
	// balancer runs fewer of them; those are kernels' and flags' business).
	withCaps(t, caps, func() { installAll(t, cfg, cgs, ifx) })
	before := pinnedLinks(t, cfg.Dir())
	// Pins are named by the programs' source names: the kernel keeps 15
	// bytes (ez_svc_getpeern for both), and without CAP_SYS_ADMIN some
	// kernels do not let cilium/ebpf read the rest from BTF.
	for _, name := range []string{"ez_svc_getpeername4", "ez_svc_getpeername6"} {
		n := 0
		for pin := range before {
			if strings.HasSuffix(pin, "/"+name) {
				n++
			}
		}
		if n != len(cgs) {
			t.Errorf("%d links pinned as %s, want one per cgroup (%d): %v", n, name, len(cgs), slices.Sorted(maps.Keys(before)))
		}
	}
	withCaps(t, caps, func() {
		d, err := Install(cfg, cgs)
		if err != nil {
			t.Fatalf("upgrade without CAP_SYS_ADMIN: %v", err)
		}
		d.Close()
	})
	after := pinnedLinks(t, cfg.Dir())
	for pin, ids := range before {
		if f := familyOf(pin); f != "shortcut" && (after[pin][0] != ids[0] || after[pin][1] == ids[1]) {
			t.Errorf("%s (%s): link/program %v after the upgrade, was %v: want the same link with a new program", pin, f, after[pin], ids)
		}
	}
}
