package bpfsys

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// IsBPFFS reports whether path is on a mounted BPF filesystem.
func IsBPFFS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC
}

// EnsureDir makes dir (mode 0700) on a BPF filesystem. When the parent of dir
// (normally /sys/fs/bpf) is not a BPF filesystem it mounts one there, as
// systemd does on most distributions; mounting is the only change it makes
// to the host outside dir.
func EnsureDir(dir string) error {
	root := filepath.Dir(filepath.Clean(dir))
	// A parent that does not exist yet is not "not a BPF filesystem": it is
	// made inside whatever filesystem holds its nearest ancestor. Taking a
	// missing parent for a foreign filesystem mounted a second bpffs over a
	// fresh directory inside /sys/fs/bpf, which uninstall cannot remove.
	if !underBPFFS(root) {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return fmt.Errorf("bpfsys: create %s: %w", root, err)
		}
		if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("bpfsys: %s is not a BPF filesystem and mounting one failed: %w", root, err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpfsys: create %s: %w", dir, err)
	}
	return os.Chmod(dir, 0o700)
}

// underBPFFS reports whether p, or the nearest ancestor of p that exists,
// is on a BPF filesystem: directories made at p land on it.
func underBPFFS(p string) bool {
	p = filepath.Clean(p)
	for {
		if _, err := os.Lstat(p); err == nil {
			return IsBPFFS(p)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return false
		}
		p = parent
	}
}
