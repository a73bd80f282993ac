package datapath

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netns"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
)

// These tests install the datapath on the real kernel: root is required.
// Links go to test cgroups, ez_sc_nat into a network namespace of the test's
// own; a run killed midway is cleaned up by the next one.

const testPinRoot = "/sys/fs/bpf/eztunnel-dptest"

// kernelEnv returns a config pinned under testPinRoot and n fresh cgroups,
// and moves the test's thread into a new network namespace.
func kernelEnv(t *testing.T, n int) (Config, []string) {
	if os.Geteuid() != 0 {
		t.Fatal("datapath kernel tests need root")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	root, err := cgroupv2.Root()
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.PinRoot = testPinRoot
	cleanup := func() {
		if bpfsys.Exists(cfg.Dir()) {
			if err := Uninstall(cfg, 0); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}
		os.RemoveAll(testPinRoot)
		old, _ := filepath.Glob(filepath.Join(root, "eztunnel-dptest-*"))
		for _, cg := range old {
			os.Remove(cg)
		}
	}
	cleanup() // what a killed run left behind

	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New() // also moves this thread there
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cleanup()
		ns.Close()
		if err := netns.Set(orig); err != nil {
			t.Errorf("return to the original netns: %v", err) // the thread stays locked and dies
			return
		}
		orig.Close()
		runtime.UnlockOSThread()
	})
	var cgs []string
	for i := range n {
		cg := filepath.Join(root, "eztunnel-dptest-"+strconv.Itoa(i))
		if err := os.Mkdir(cg, 0o755); err != nil {
			t.Fatal(err)
		}
		cgs = append(cgs, cg)
	}
	return cfg, cgs
}

// linkState maps every pinned link (of every family) to its link and program IDs.
type linkState map[string][2]uint32

func pinnedLinks(t *testing.T, dir string) linkState {
	t.Helper()
	var pins []string
	for _, k := range kinds { // every family's directory
		ps, err := bpfsys.PinnedLinks(filepath.Join(dir, k.maps))
		if err != nil {
			t.Fatal(err)
		}
		pins = append(pins, ps...)
	}
	out := linkState{}
	for _, pin := range pins {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimPrefix(pin, dir+"/")] = [2]uint32{uint32(info.ID), uint32(info.Program)}
	}
	// Legacy tc filters (kernels without tcx, EZTUNNEL_TEST_LEGACY_TC=1):
	// their records, link ID 0.
	for _, k := range kinds {
		recs, err := bpfsys.TCRecords(filepath.Join(dir, k.maps))
		if err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			p, err := ebpf.LoadPinnedProgram(rec, nil)
			if err != nil {
				t.Fatal(err)
			}
			info, err := p.Info()
			p.Close()
			if err != nil {
				t.Fatal(err)
			}
			id, _ := info.ID()
			out[strings.TrimPrefix(rec, dir+"/")] = [2]uint32{0, uint32(id)}
		}
	}
	return out
}

// skMsgProgram is the ID of the sk_msg program attached to the sockhash.
func skMsgProgram(t *testing.T, dir string) ebpf.ProgramID {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "ez_sc_sockets"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: m.FD(), Attach: ebpf.AttachSkMsgVerdict})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Programs) != 1 {
		t.Fatalf("%d sk_msg programs on the sockhash, want 1", len(res.Programs))
	}
	return res.Programs[0].ID
}

func cgroupPrograms(t *testing.T, cg string, at ebpf.AttachType) int {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: cgroupFD(t, cg), Attach: at})
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Programs)
}

func cgroupFD(t *testing.T, cg string) int {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

func install(t *testing.T, cfg Config, cgs []string) {
	t.Helper()
	d, err := Install(cfg, cgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

var errForced = errors.New("forced failure")

// An install over a pinned datapath that fails after it updated a link
// leaves every pinned link with its old program, and pins nothing new.
func TestInstallOverPinnedRollsBack(t *testing.T) {
	cfg, cgs := kernelEnv(t, 3)
	install(t, cfg, cgs[:2])
	before := pinnedLinks(t, cfg.Dir())
	msgBefore := skMsgProgram(t, cfg.Dir())
	ownerBefore := recvOwner(t, cfg.Dir())
	if ownerBefore == 0 {
		t.Fatal("no ez_sc_recv counts reads after install")
	}
	// 2 cgroups x 3 hooks, ez_sc_recv, ez_sc_close_reset on lo (a new
	// netns), the NAT learner's (2 netfilter families; none where the close
	// reset's tc program learns) and the splice guard's link(s).
	if n := spliceLinks(before); n < 1 || len(before) != 8+natLinks(before)+n {
		t.Fatalf("pinned links after install: %v", before)
	}

	// Fail right after the first link update, then after every update, at
	// the new cgroup's first link pin.
	for _, failAt := range []string{"update", "pin " + cfg.Dir() + "/links/cgroup"} {
		var changed []string
		var during linkState
		installFault = func(change string) error {
			changed = append(changed, change)
			if strings.HasPrefix(change, failAt) && during == nil {
				during = pinnedLinks(t, cfg.Dir())
				return errForced
			}
			return nil
		}
		_, err := Install(cfg, cgs)
		installFault = nil
		if !errors.Is(err, errForced) {
			t.Fatalf("fail at %s: install returned %v, want the forced failure (changes %v)", failAt, err, changed)
		}
		if failAt == "update" {

			// The failure must come after the link really got the new program.
			pin := strings.TrimPrefix(changed[len(changed)-1], "update "+cfg.Dir()+"/")
			if during[pin][1] == 0 || during[pin][1] == before[pin][1] {
				t.Fatalf("link %s had program %d at the failure, before %d: not updated", pin, during[pin][1], before[pin][1])
			}
		}
		if updates := len(slices.DeleteFunc(slices.Clone(changed), func(c string) bool { return !strings.HasPrefix(c, "update ") })); failAt != "update" && updates != 6 { // 2 cgroups x 3 hooks
			t.Fatalf("%d link updates before the new cgroup's pin, want 6: %v", updates, changed)
		}
		after := pinnedLinks(t, cfg.Dir())
		if !mapsEqual(before, after) {
			t.Errorf("fail at %s: pinned links (link, program IDs)\nbefore %v\nafter  %v", failAt, before, after)
		}
		if got := skMsgProgram(t, cfg.Dir()); got != msgBefore {
			t.Errorf("fail at %s: sk_msg program %d, want the old %d", failAt, got, msgBefore)
		}
		if n := cgroupPrograms(t, cgs[2], ebpf.AttachCGroupSockOps); n != 0 {
			t.Errorf("fail at %s: %d sockops programs left on the new cgroup", failAt, n)
		}
		if got := recvOwner(t, cfg.Dir()); got != ownerBefore {
			t.Errorf("fail at %s: the counting ez_sc_recv is %d, want the old %d", failAt, got, ownerBefore)
		}
		for _, leftover := range []string{"prog_ez_sc_msg_next", "links/netfilter/ez_sc_nat_ipv4_next", "links/tracing/ez_sc_recv_next"} {
			if bpfsys.Exists(filepath.Join(cfg.Dir(), leftover)) {
				t.Errorf("fail at %s: %s left pinned", failAt, leftover)
			}
		}
	}

	// A successful install updates the same links to new programs.
	install(t, cfg, cgs)
	after := pinnedLinks(t, cfg.Dir())
	for pin, ids := range before {
		if !strings.HasPrefix(pin, "links/cgroup/") && !strings.HasPrefix(pin, "links/tcx/") && !strings.HasPrefix(pin, bpfsys.TCDir+"/") {
			continue // netfilter links are replaced, not updated
		}
		if got := after[pin]; got[0] != ids[0] || got[1] == ids[1] {
			t.Errorf("%s: link/program %v after upgrade, was %v: want the same link with a new program", pin, got, ids)
		}
	}
	if len(after) != 11+natLinks(after)+spliceLinks(after) {
		t.Errorf("pinned links after the upgrade: %v", after)
	}
	if got := recvOwner(t, cfg.Dir()); got == 0 || got == ownerBefore {
		t.Errorf("the counting ez_sc_recv is %d after the upgrade, was %d: want the new one", got, ownerBefore)
	}
	if after["links/tracing/ez_sc_recv"][0] == before["links/tracing/ez_sc_recv"][0] {
		t.Errorf("ez_sc_recv link not replaced: %v", after["links/tracing/ez_sc_recv"])
	}
}

func mapsEqual(a, b linkState) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// pinFlat moves the links to the names of the flat layout of earlier builds.
func pinFlat(t *testing.T, dir string) {
	t.Helper()
	pins, err := bpfsys.PinnedLinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, pin := range pins {
		rel := strings.Split(strings.TrimPrefix(pin, filepath.Join(dir, bpfsys.LinksDir)+"/"), "/")
		var name string
		switch rel[0] {
		case bpfsys.KindNetfilter: // ez_sc_nat_ipv4 -> link_nat_ipv4
			name = "link_" + strings.TrimPrefix(rel[1], "ez_sc_")
		case bpfsys.KindCgroup: // <id>/ez_sc_egress -> link_egress_<id>
			if rel[2] == "ez_sc_sock_release" { // newer than the flat layout: dropped (detached)
				if err := os.Remove(pin); err != nil {
					t.Fatal(err)
				}
				continue
			}
			name = "link_" + strings.TrimPrefix(rel[2], "ez_sc_") + "_" + rel[1]
		case bpfsys.KindTracing, bpfsys.KindTCX: // not in the flat layout: dropped (detached)
			if err := os.Remove(pin); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.Rename(pin, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(filepath.Join(dir, bpfsys.LinksDir)); err != nil {
		t.Fatal(err)
	}
}

// A datapath pinned with the flat link_* names of earlier builds is adopted
// (its links updated in place, none attached twice) and uninstalled.
func TestAdoptFlatLayout(t *testing.T) {
	// The flat layout had the NAT learner's netfilter links: learn there.
	t.Setenv(bpfsys.TestRefuseEnv, "ez_sc_nat_ct,ez_sc_nat_tc")
	cfg, cgs := kernelEnv(t, 1)
	install(t, cfg, cgs)
	before := pinnedLinks(t, cfg.Dir())
	pinFlat(t, cfg.Dir())
	if flat, _ := filepath.Glob(filepath.Join(cfg.Dir(), "link_*")); len(flat) != 4 {
		t.Fatalf("flat pins: %v", flat)
	}

	install(t, cfg, cgs)
	after := pinnedLinks(t, cfg.Dir())
	for pin, ids := range before {
		got, ok := after[pin]
		if !ok {
			t.Errorf("%s not pinned after adoption: %v", pin, after)
		} else if strings.HasPrefix(pin, "links/cgroup/") && !strings.HasSuffix(pin, "/ez_sc_sock_release") && got[0] != ids[0] {
			t.Errorf("%s: link %d after adoption, want the adopted link %d", pin, got[0], ids[0])
		}
	}
	if flat, _ := filepath.Glob(filepath.Join(cfg.Dir(), "link_*")); len(flat) != 0 {
		t.Errorf("flat pins left: %v", flat)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInetEgress, ebpf.AttachCGroupSockOps} {
		if n := cgroupPrograms(t, cgs[0], at); n != 1 {
			t.Errorf("%d programs of %v on the cgroup, want 1", n, at)
		}
	}

	// Uninstall of a flat layout detaches everything too.
	pinFlat(t, cfg.Dir())
	if err := Uninstall(cfg, 0); err != nil {
		t.Fatal(err)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInetEgress, ebpf.AttachCGroupSockOps} {
		if n := cgroupPrograms(t, cgs[0], at); n != 0 {
			t.Errorf("%d programs of %v left on the cgroup after uninstall", n, at)
		}
	}
	if bpfsys.Exists(cfg.Dir()) {
		t.Error("pin directory left after uninstall")
	}
}

// recvOwner reads EZ_CTL_RECV_OWNER: the instance of the ez_sc_recv that counts reads.
func recvOwner(t *testing.T, dir string) uint32 {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "ez_sc_control"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var v uint32
	if err := m.Lookup(uint32(1), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The RST on close on a pod's loopback: attached in the namespace a path
// names, and unpinned once that namespace is gone (its loopback device went
// with it, so the link is defunct).
func TestLoopbackLinksPruned(t *testing.T) {
	cfg, cgs := kernelEnv(t, 1)
	d, err := Install(cfg, cgs)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const name = "eztunnel-dptest-lo"
	netns.DeleteNamed(name) // what a killed run left
	cur, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	ns, err := netns.NewNamed(name) // moves this (locked) thread there
	if err != nil {
		t.Fatal(err)
	}
	ns.Close()
	if err := netns.Set(cur); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.DeleteNamed(name) })

	sync := func(paths ...string) (attached, pruned []string) {
		t.Helper()
		tx := &bpfsys.Tx{}
		attached, pruned, _, err := d.sc.SyncLoopbacks(tx, paths)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return attached, pruned
	}
	attached, _ := sync(filepath.Join("/run/netns", name))
	if len(attached) != 1 || !strings.HasSuffix(attached[0], "/1/ez_sc_close_reset_egress") && !strings.HasSuffix(attached[0], "/1/ez_close_reset_egress") { // tcx; legacy tc
		t.Fatalf("attached %v, want the namespace's loopback at egress", attached)
	}
	pin := attached[0]
	if again, _ := sync(filepath.Join("/run/netns", name)); len(again) != 0 {
		t.Errorf("attached again: %v", again)
	}
	if err := netns.DeleteNamed(name); err != nil {
		t.Fatal(err)
	}
	// The kernel frees a namespace from a workqueue.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, pruned := sync()
		if slices.Contains(pruned, pin) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not pruned after its namespace went", pin)
		}
	}
	if bpfsys.Exists(pin) {
		t.Errorf("%s still pinned", pin)
	}
}

// mapIDs maps each of the shortcut's pinned maps (by its name now) to the
// ID of the map pinned under name(it).
func mapIDs(t *testing.T, dir string, name func(string) string) map[string]ebpf.MapID {
	t.Helper()
	out := map[string]ebpf.MapID{}
	for _, m := range shortcut.PinnedMaps() {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(dir, name(m)), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		info, err := mp.Info()
		mp.Close()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		out[m] = id
	}
	return out
}

func unprefixed(m string) string { return "ez_" + strings.TrimPrefix(m, "ez_sc_") }

// pinUnprefixed renames the shortcut's maps, and its links and programs
// pinned under a program's name, to the names builds before the ez_sc_
// prefix pinned them under.
func pinUnprefixed(t *testing.T, dir string) {
	t.Helper()
	for _, m := range shortcut.PinnedMaps() {
		if err := os.Rename(filepath.Join(dir, m), filepath.Join(dir, unprefixed(m))); err != nil {
			t.Fatal(err)
		}
	}
	var pins []string
	for _, sub := range []string{bpfsys.LinksDir, "progs"} {
		filepath.WalkDir(filepath.Join(dir, sub), func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				pins = append(pins, path)
			}
			return nil
		})
	}
	pins = append(pins, filepath.Join(dir, "prog_ez_sc_msg"))
	n := 0
	for _, pin := range pins {
		base := filepath.Base(pin)
		old := strings.Replace(base, "ez_sc_", "ez_", 1)
		if old == base || isSplicePin(base) {
			continue // the splice guard came after the prefix: never unprefixed
		}
		if err := os.Rename(pin, filepath.Join(filepath.Dir(pin), old)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n < 9 { // 3 cgroup links, 2 netfilter, ez_recv, lo's close reset, progs/, prog_ez_msg
		t.Fatalf("renamed %d link and program pins: %v", n, pins)
	}
}

// A datapath an earlier build pinned without the family prefix is read as
// it is (status), adopted in place by an install (the same maps and links
// under their new names, the links with new programs; a failed install
// gives everything its old name back), and uninstalled.
func TestAdoptUnprefixedNames(t *testing.T) {
	cfg, cgs := kernelEnv(t, 1)
	install(t, cfg, cgs)
	ids := mapIDs(t, cfg.Dir(), func(m string) string { return m })
	links := pinnedLinks(t, cfg.Dir())
	pinUnprefixed(t, cfg.Dir())

	p, err := OpenPinned(cfg)
	if err != nil {
		t.Fatalf("status of an unprefixed datapath: %v", err)
	}
	if _, err := ReadCounters(p.Counters); err != nil {
		t.Fatal(err)
	}
	if n, err := shortcut.Entries(p.Pairs); err != nil || n != 0 {
		t.Fatalf("pairs of an idle datapath: %d, %v", n, err)
	}
	p.Close()

	installFailingAt(t, cfg, cgs, "update ")
	if got := mapIDs(t, cfg.Dir(), unprefixed); !maps.Equal(got, ids) {
		t.Fatalf("after a failed install, maps under their old names %v, want %v", got, ids)
	}
	oldNames := linkState{}
	for pin, ids := range links {
		if isSplicePin(filepath.Base(pin)) {
			oldNames[pin] = ids // never unprefixed (pinUnprefixed)
			continue
		}
		oldNames[strings.ReplaceAll(pin, "ez_sc_", "ez_")] = ids
	}
	if got := pinnedLinks(t, cfg.Dir()); !mapsEqual(oldNames, got) {
		t.Errorf("a failed install changed the links:\nwant %v\ngot  %v", oldNames, got)
	}

	install(t, cfg, cgs)
	if got := mapIDs(t, cfg.Dir(), func(m string) string { return m }); !maps.Equal(got, ids) {
		t.Errorf("after adoption, maps %v, want the same maps %v", got, ids)
	}
	for _, m := range shortcut.PinnedMaps() {
		if bpfsys.Exists(filepath.Join(cfg.Dir(), unprefixed(m))) {
			t.Errorf("%s still pinned under its old name", m)
		}
	}
	after := pinnedLinks(t, cfg.Dir())
	if len(after) != len(links) {
		t.Errorf("links after adoption %v, want %v", after, links)
	}
	for pin, l := range links {
		if (strings.HasPrefix(pin, "links/cgroup/") || strings.HasPrefix(pin, "links/tcx/")) && (after[pin][0] != l[0] || after[pin][1] == l[1]) {
			t.Errorf("%s: link/program %v after adoption, was %v: want the adopted link with a new program", pin, after[pin], l)
		}
	}

	pinUnprefixed(t, cfg.Dir())
	if err := Uninstall(cfg, 0); err != nil {
		t.Fatal(err)
	}
	if bpfsys.Exists(cfg.Dir()) {
		t.Error("pin directory left after uninstall")
	}
}

// isSplicePin reports whether a link pin is the splice guard's
// (bpf/shortcut/splice.h), whose programs came after the family prefix.
func isSplicePin(base string) bool {
	for _, p := range []string{"ez_sc_splice", "ez_sc_sendfile"} {
		if strings.HasPrefix(base, p) {
			return true
		}
	}
	return false
}

// spliceLinks counts the splice guard's pinned links: one on the fentry or
// the raw tracepoint, two on the syscall events.
// natLinks counts the NAT learner's links among links: the netfilter
// link's two families, or the one tracing link; none where the close
// reset's tc program learns.
func natLinks(links linkState) int {
	n := 0
	for pin := range links {
		base := filepath.Base(pin)
		if strings.HasPrefix(pin, bpfsys.LinksDir+"/") && strings.HasPrefix(base, "ez_sc_nat") {
			n++
		}
	}
	return n
}

func spliceLinks(links linkState) int {
	n := 0
	for pin := range links {
		if strings.HasPrefix(pin, bpfsys.LinksDir+"/tracing/") && isSplicePin(filepath.Base(pin)) {
			n++
		}
	}
	return n
}
