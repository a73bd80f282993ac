package kube

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
)

// Layout is where the kubelet puts pod cgroups in the cgroup2 hierarchy.
type Layout struct {
	PodsRoot string // kubepods (cgroupfs) or kubepods.slice (systemd) directory
	Driver   string // DriverCgroupfs or DriverSystemd
}

// PodsRoot returns the pods' root cgroup directory (the attach point).
func PodsRoot(cfg Config) (string, error) {
	l, err := DetectLayout(cfg)
	return l.PodsRoot, err
}

// DetectLayout finds the pods' root cgroup and the cgroup driver. With
// PodsCgroup set and the driver auto, a ".slice" name means systemd.
// In a hybrid layout Cgroup2Root is the cgroup2 mount (/sys/fs/cgroup/unified).
func DetectLayout(cfg Config) (Layout, error) {
	if err := cfg.Validate(); err != nil {
		return Layout{}, err
	}
	root := cfg.Cgroup2Root
	if root == "" {
		r, err := cgroupv2.Root()
		if err != nil {
			return Layout{}, fmt.Errorf("kubernetes: %w", err)
		}
		root = r
	}
	driver := cfg.Driver
	if driver == "" {
		driver = DriverAuto
	}
	if cfg.PodsCgroup != "" {
		dir := cfg.PodsCgroup
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(root, dir)
		}
		if err := isDir(dir); err != nil {
			return Layout{}, fmt.Errorf("kubernetes: pods cgroup %q: %w", dir, err)
		}
		if driver == DriverAuto {
			driver = DriverCgroupfs
			if strings.HasSuffix(dir, ".slice") {
				driver = DriverSystemd
			}
		}
		return Layout{PodsRoot: dir, Driver: driver}, nil
	}
	fsDir, sdDir := filepath.Join(root, "kubepods"), filepath.Join(root, "kubepods.slice")
	switch driver {
	case DriverCgroupfs:
		if err := isDir(fsDir); err != nil {
			return Layout{}, fmt.Errorf("kubernetes: cgroupfs driver: pods cgroup %q: %w", fsDir, err)
		}
		return Layout{PodsRoot: fsDir, Driver: driver}, nil
	case DriverSystemd:
		if err := isDir(sdDir); err != nil {
			return Layout{}, fmt.Errorf("kubernetes: systemd driver: pods cgroup %q: %w", sdDir, err)
		}
		return Layout{PodsRoot: sdDir, Driver: driver}, nil
	}
	fsOK, sdOK := isDir(fsDir) == nil, isDir(sdDir) == nil
	switch {
	case fsOK && sdOK:
		return Layout{}, fmt.Errorf("kubernetes: both %q and %q exist: pass --cgroup-driver cgroupfs|systemd or --pods-cgroup", fsDir, sdDir)
	case fsOK:
		return Layout{PodsRoot: fsDir, Driver: DriverCgroupfs}, nil
	case sdOK:
		return Layout{PodsRoot: sdDir, Driver: DriverSystemd}, nil
	}
	return Layout{}, fmt.Errorf("kubernetes: no pods cgroup: neither %q (cgroupfs driver) nor %q (systemd driver) exists; is the kubelet running, and is %q the cgroup2 mount (--cgroup2-root)?", fsDir, sdDir, root)
}

func isDir(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	return nil
}

// PodPaths returns the candidate pod-level cgroup directories of a pod, most
// likely first. An empty QoS class gives all three classes.
//
//	cgroupfs: kubepods/pod<uid>, kubepods/burstable/pod<uid>, kubepods/besteffort/pod<uid>
//	systemd:  kubepods.slice/kubepods-pod<uid_>.slice,
//	          kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice, ...
//
// (uid_ is the UID with '-' replaced by '_'; the systemd prefix follows the
// root slice's name, so a custom --cgroup-root slice works too.)
func (l Layout) PodPaths(uid string, qos kubeapi.PodQOSClass) []string {
	classes := []kubeapi.PodQOSClass{qos}
	if qos == "" {
		classes = []kubeapi.PodQOSClass{kubeapi.PodQOSBurstable, kubeapi.PodQOSBestEffort, kubeapi.PodQOSGuaranteed}
	}
	out := make([]string, 0, len(classes))
	for _, c := range classes {
		if p := l.podPath(uid, c); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (l Layout) podPath(uid string, qos kubeapi.PodQOSClass) string {
	var class string
	switch qos {
	case kubeapi.PodQOSGuaranteed:
	case kubeapi.PodQOSBurstable:
		class = "burstable"
	case kubeapi.PodQOSBestEffort:
		class = "besteffort"
	default:
		return ""
	}
	if l.Driver == DriverSystemd {
		prefix := strings.TrimSuffix(filepath.Base(l.PodsRoot), ".slice")
		u := strings.ReplaceAll(uid, "-", "_")
		if class == "" {
			return filepath.Join(l.PodsRoot, prefix+"-pod"+u+".slice")
		}
		return filepath.Join(l.PodsRoot, prefix+"-"+class+".slice", prefix+"-"+class+"-pod"+u+".slice")
	}
	if class == "" {
		return filepath.Join(l.PodsRoot, "pod"+uid)
	}
	return filepath.Join(l.PodsRoot, class, "pod"+uid)
}

// Resolve returns the first existing candidate directory of a pod and its
// cgroup ID. ok is false when none exists yet; err reports other failures.
func (l Layout) Resolve(uid string, qos kubeapi.PodQOSClass) (path string, id uint64, ok bool, err error) {
	for _, p := range l.PodPaths(uid, qos) {
		id, e := cgroupv2.ID(p)
		if e == nil {
			return p, id, true, nil
		}
		if !errors.Is(e, fs.ErrNotExist) && err == nil {
			err = e
		}
	}
	return "", 0, false, err
}
