package kube

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

const testUID = "0b5c7a4e-1f2d-4c3b-9a8e-7d6f5e4c3b2a"

func mkdirs(t testing.TB, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func inode(t testing.TB, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestPodCgroupPaths maps a pod to its directory for both drivers, every QoS
// class, and the pure v2 and hybrid mounts, on a directory tree shaped like
// the kubelet's.
func TestPodCgroupPaths(t *testing.T) {
	u := strings.ReplaceAll(testUID, "-", "_")
	cases := []struct {
		driver string
		qos    kubeapi.PodQOSClass
		rel    string // pod dir under the cgroup2 mount
	}{
		{DriverCgroupfs, kubeapi.PodQOSGuaranteed, "kubepods/pod" + testUID},
		{DriverCgroupfs, kubeapi.PodQOSBurstable, "kubepods/burstable/pod" + testUID},
		{DriverCgroupfs, kubeapi.PodQOSBestEffort, "kubepods/besteffort/pod" + testUID},
		{DriverSystemd, kubeapi.PodQOSGuaranteed, "kubepods.slice/kubepods-pod" + u + ".slice"},
		{DriverSystemd, kubeapi.PodQOSBurstable, "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + u + ".slice"},
		{DriverSystemd, kubeapi.PodQOSBestEffort, "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + u + ".slice"},
	}
	for _, mount := range []string{"", "unified"} { // pure v2: /sys/fs/cgroup; hybrid: /sys/fs/cgroup/unified
		for _, c := range cases {
			for _, cfgDriver := range []string{c.driver, DriverAuto, ""} {
				for _, statusQOS := range []kubeapi.PodQOSClass{c.qos, ""} {
					name := filepath.Join("mount="+mount, c.rel, "driver="+cfgDriver, "qos="+string(statusQOS))
					root := filepath.Join(t.TempDir(), mount)
					pod := filepath.Join(root, c.rel)
					// The container cgroup below it and the QoS dirs the kubelet always makes.
					top := strings.SplitN(c.rel, "/", 2)[0]
					mkdirs(t, filepath.Join(pod, "0123456789abcdef"), filepath.Join(root, top, "burstable"))
					l, err := DetectLayout(Config{NodeName: "n", Cgroup2Root: root, Driver: cfgDriver})
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if l.Driver != c.driver || l.PodsRoot != filepath.Join(root, top) {
						t.Fatalf("%s: layout %+v", name, l)
					}
					if pr, err := PodsRoot(Config{NodeName: "n", Cgroup2Root: root, Driver: cfgDriver}); err != nil || pr != l.PodsRoot {
						t.Fatalf("%s: PodsRoot = %q, %v", name, pr, err)
					}
					paths := l.PodPaths(testUID, statusQOS)
					if statusQOS != "" && (len(paths) != 1 || paths[0] != pod) {
						t.Fatalf("%s: PodPaths = %q, want [%q]", name, paths, pod)
					}
					if statusQOS == "" && len(paths) != 3 {
						t.Fatalf("%s: PodPaths = %q, want all three classes", name, paths)
					}
					got, id, ok, err := l.Resolve(testUID, statusQOS)
					if err != nil || !ok || got != pod {
						t.Fatalf("%s: Resolve = %q, %v, %v; want %q", name, got, ok, err, pod)
					}
					if want := inode(t, pod); id != want || id == 0 {
						t.Fatalf("%s: id %d, want inode %d", name, id, want)
					}
					// Another pod's UID finds nothing, without an error.
					if p, _, ok, err := l.Resolve("11111111-2222-3333-4444-555555555555", statusQOS); ok || err != nil {
						t.Fatalf("%s: other uid resolved to %q, %v", name, p, err)
					}
				}
			}
		}
	}
}

func TestDetectLayoutErrors(t *testing.T) {
	root := t.TempDir()
	fsDir, sdDir := filepath.Join(root, "kubepods"), filepath.Join(root, "kubepods.slice")
	check := func(name string, cfg Config, want ...string) {
		t.Helper()
		cfg.NodeName, cfg.Cgroup2Root = "n", root
		_, err := DetectLayout(cfg)
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s: %v; want %q in it", name, err, w)
			}
		}
	}
	check("neither, auto", Config{}, fsDir, sdDir)
	check("cgroupfs missing", Config{Driver: DriverCgroupfs}, fsDir)
	check("systemd missing", Config{Driver: DriverSystemd}, sdDir)
	check("pods cgroup missing", Config{PodsCgroup: "custom"}, filepath.Join(root, "custom"))
	mkdirs(t, fsDir, sdDir)
	check("both, auto", Config{}, fsDir, sdDir, "--cgroup-driver")
	for drv, want := range map[string]string{DriverCgroupfs: fsDir, DriverSystemd: sdDir} {
		if l, err := DetectLayout(Config{NodeName: "n", Cgroup2Root: root, Driver: drv}); err != nil || l.PodsRoot != want {
			t.Fatalf("both exist, driver %s: %+v, %v", drv, l, err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	check("pods cgroup is a file", Config{PodsCgroup: filepath.Join(root, "file")}, "not a directory")
}

// TestPodsCgroupOverride: kubelet --cgroup-root moves the pods' root; a
// relative --pods-cgroup is under the cgroup2 mount, a .slice name means systemd.
func TestPodsCgroupOverride(t *testing.T) {
	root := t.TempDir()
	fsRoot := filepath.Join(root, "custom", "kubepods")
	sdRoot := filepath.Join(root, "custom.slice", "custom-kubepods.slice")
	u := strings.ReplaceAll(testUID, "-", "_")
	fsPod := filepath.Join(fsRoot, "besteffort", "pod"+testUID)
	sdPod := filepath.Join(sdRoot, "custom-kubepods-burstable.slice", "custom-kubepods-burstable-pod"+u+".slice")
	mkdirs(t, fsPod, sdPod)
	for _, c := range []struct {
		pods, driver, wantDriver, wantPod string
		qos                               kubeapi.PodQOSClass
	}{
		{"custom/kubepods", "", DriverCgroupfs, fsPod, kubeapi.PodQOSBestEffort},
		{fsRoot, DriverCgroupfs, DriverCgroupfs, fsPod, ""},
		{"custom.slice/custom-kubepods.slice", DriverAuto, DriverSystemd, sdPod, kubeapi.PodQOSBurstable},
		{sdRoot, DriverSystemd, DriverSystemd, sdPod, ""},
	} {
		l, err := DetectLayout(Config{NodeName: "n", Cgroup2Root: root, PodsCgroup: c.pods, Driver: c.driver})
		if err != nil || l.Driver != c.wantDriver {
			t.Fatalf("%q: %+v, %v", c.pods, l, err)
		}
		if p, id, ok, err := l.Resolve(testUID, c.qos); !ok || err != nil || p != c.wantPod || id != inode(t, c.wantPod) {
			t.Fatalf("%q: Resolve = %q %d %v %v, want %q", c.pods, p, id, ok, err, c.wantPod)
		}
	}
}

// TestPodsRootFromMounts: with no Cgroup2Root the cgroup2 mount comes from
// /proc/mounts; this host runs no kubelet, so the error names both candidates
// under the real mount.
func TestPodsRootFromMounts(t *testing.T) {
	mount, err := cgroupv2.Root()
	if err != nil {
		t.Fatalf("this host needs a cgroup2 mount: %v", err)
	}
	got, err := PodsRoot(Config{NodeName: "n"})
	fsDir, sdDir := filepath.Join(mount, "kubepods"), filepath.Join(mount, "kubepods.slice")
	if isDir(fsDir) == nil || isDir(sdDir) == nil {
		// A kubelet runs here (the cluster harness): the root is under the mount.
		if err == nil && got != fsDir && got != sdDir {
			t.Fatalf("PodsRoot = %q, want %q or %q", got, fsDir, sdDir)
		}
		if err != nil && !strings.Contains(err.Error(), mount) {
			t.Fatalf("PodsRoot = %v, want the mount %q named", err, mount)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), fsDir) || !strings.Contains(err.Error(), sdDir) {
		t.Fatalf("PodsRoot without a kubelet = %q, %v; want both %q and %q named", got, err, fsDir, sdDir)
	}
}
