// Package e2e runs eztunnel against the real kernel: pods are network
// namespaces on a bridge, each result is compared with plain kernel TCP.
// Requires root; it fails, never skips, when it cannot run.
package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/eztunnel/eztunnel/internal/netlab"
)

// bin is the eztunnel binary under test, built once by TestMain.
var bin string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: FAIL: these tests need root (BPF, netns, cgroups); run `sudo make test`")
		os.Exit(1)
	}
	if err := netlab.Sweep(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: sweeping leftovers:", err)
	}
	dir, err := os.MkdirTemp("", "eztunnel-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Chmod(dir, 0o755) // the not-root test runs it as nobody
	bin = filepath.Join(dir, "eztunnel")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/eztunnel")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build eztunnel:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if err := netlab.Sweep(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: leftovers after tests:", err)
		code = 1
	}
	os.Exit(code)
}
