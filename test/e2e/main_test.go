// Package e2e runs eztunnel against the real kernel: pods are network
// namespaces on a bridge, each result is compared with plain kernel TCP.
// Requires root; it fails, never skips, when it cannot run.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/k8scluster"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// bin is the eztunnel agent binary under test and labBin the lab binary
// (workloads, benchmarks, plots), both built once by TestMain.
var bin, labBin string

// buildVersion is stamped into both binaries, as the Makefile does.
const buildVersion = "e2e-build"

func TestMain(m *testing.M) {
	// A child of TestMetricsScrapeStorm holding sockets (TestSockhashHolder):
	// nothing to build or sweep.
	if os.Getenv("EZTUNNEL_E2E_HOLD") != "" {
		os.Exit(m.Run())
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "e2e: FAIL: these tests need root (BPF, netns, cgroups); run `sudo make test`")
		os.Exit(1)
	}
	if err := netlab.Sweep(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: sweeping leftovers:", err)
	}
	// A killed `make test-k8s` leaves the cluster's chains in the host's
	// FORWARD path, which every lab packet then passes.
	if err := k8scluster.SweepKilled(""); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: sweeping a killed Kubernetes lab run:", err)
	}
	// A directory that names its owner, so that a later run can remove a
	// killed run's (netlab.RunDir).
	dir, err := netlab.RunDir(buildDirPrefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Chmod(dir, 0o755) // the not-root test runs it as nobody
	// Everything the run puts in the temporary directory (t.TempDir, the
	// lab's and the go command's work files) goes in the run's directory,
	// so that the next run removes a SIGKILLed run's with it.
	os.Setenv("TMPDIR", dir)
	os.Setenv("GOTMPDIR", dir)
	bin = filepath.Join(dir, "eztunnel")
	labBin = filepath.Join(dir, "eztunnel-lab")
	builds := map[string]string{bin: "../../cmd/eztunnel", labBin: "../../lab/cmd/eztunnel-lab"}
	// EZTUNNEL_E2E_BIN_DIR: use the eztunnel and eztunnel-lab prebuilt there
	// (with -X main.version=e2e-build, the directory readable by nobody)
	// instead of building them: scripts/kernels runs the tests in a VM
	// without Go.
	if pre := os.Getenv("EZTUNNEL_E2E_BIN_DIR"); pre != "" {
		bin, labBin, builds = filepath.Join(pre, "eztunnel"), filepath.Join(pre, "eztunnel-lab"), nil
	}
	for out, pkg := range builds {
		build := sysexec.Command(context.Background(), "go", "build", "-ldflags", "-X main.version="+buildVersion, "-o", out, pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: build", pkg+":", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	if err := netlab.Sweep(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: leftovers after tests:", err)
		code = 1
	}
	os.Exit(code)
}

// buildDirPrefix names the directory each run builds its binaries into.
const buildDirPrefix = "eztunnel-e2e-"
