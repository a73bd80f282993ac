//go:build k8s

// Package k8s runs eztunnel as a DaemonSet on a real single-node cluster
// built on this machine (lab/k8scluster): `make test-k8s`. Requires root; it
// fails, never skips, when it cannot run.
package k8s

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/internal/toolbin"
	"github.com/eztunnel/eztunnel/lab/k8scluster"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// Images built by TestMain and imported into the cluster.
const (
	labImage    = "registry.local/eztunnel/lab:1"
	agentRepo   = "registry.local/eztunnel/eztunnel"
	agentTag    = "1"
	agentTagNew = "2" // the upgrade: same binary, one more file, new digest
	pinPath     = "/sys/fs/bpf/eztunnel"
)

var (
	cl         *k8scluster.Cluster
	cg2Root    string // the cgroup2 mount
	workDir    string
	kubeBinDir string // kubectl and the cluster's binaries
)

// fail ends the run before any cluster runs (or once Start has failed and
// cleaned up), removing the run's directory, which os.Exit would skip.
func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "k8s: FAIL: "+format+"\n", args...)
	if workDir != "" {
		os.RemoveAll(workDir)
	}
	os.Exit(1)
}

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fail("these tests need root (a cluster, BPF, cgroups); run `sudo make test-k8s`")
	}
	var err error
	if cg2Root, err = cgroupv2.Root(); err != nil {
		fail("cgroup2: %v", err)
	}
	// Removes the directories of killed runs too (netlab.RunDir).
	if workDir, err = netlab.RunDir("eztunnel-k8s-"); err != nil {
		fail("%v", err)
	}
	code := run(m)
	os.RemoveAll(workDir)
	os.Exit(code)
}

func run(m *testing.M) (code int) {
	t0 := time.Now()
	binDir, err := kubeBins()
	if err != nil {
		fail("kubernetes binaries: %v", err)
	}
	kubeBinDir = binDir
	fmt.Fprintf(os.Stderr, "k8s: kubernetes binaries in %s (%.0fs)\n", binDir, time.Since(t0).Seconds())
	t1 := time.Now()
	for out, pkg := range map[string]string{
		"eztunnel":     "../../cmd/eztunnel",
		"eztunnel-lab": "../../lab/cmd/eztunnel-lab",
		"pause":        "../../lab/k8scluster/pause",
	} {
		if err := goBuild(filepath.Join(workDir, out), pkg); err != nil {
			fail("build %s: %v", pkg, err)
		}
	}
	w := func(p string) string { return filepath.Join(workDir, p) }
	if err := os.WriteFile(w("VERSION"), []byte(agentTagNew+"\n"), 0o644); err != nil {
		fail("%v", err)
	}
	repo, err := toolbin.RepoRoot()
	if err != nil {
		fail("%v", err)
	}
	ezimage, err := toolbin.Build(context.Background(), repo, "ezimage")
	if err != nil {
		fail("build ezimage: %v", err)
	}
	// Reproducible OCI archives (tools/ezimage), imported with ctr.
	for _, im := range []struct {
		tar, ref, entry string
		files           []string
	}{
		{w("pause.tar"), k8scluster.PauseImage, "/pause", []string{w("pause") + ":/pause"}},
		{w("lab.tar"), labImage, "/eztunnel-lab", []string{w("eztunnel-lab") + ":/eztunnel-lab"}},
		{w("agent1.tar"), agentRepo + ":" + agentTag, "/eztunnel", []string{w("eztunnel") + ":/eztunnel"}},
		{w("agent2.tar"), agentRepo + ":" + agentTagNew, "/eztunnel", []string{w("eztunnel") + ":/eztunnel", w("VERSION") + ":/VERSION:0644"}},
	} {
		args := []string{"--out", im.tar, "--name", im.ref, "--entrypoint", im.entry}
		for _, f := range im.files {
			args = append(args, "--file", f)
		}
		if out, err := sysexec.Command(context.Background(), ezimage, args...).CombinedOutput(); err != nil {
			fail("image %s: %v\n%s", im.ref, err, out)
		}
	}
	fmt.Fprintf(os.Stderr, "k8s: binaries and images built (%.0fs)\n", time.Since(t1).Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	t2 := time.Now()
	cl, err = k8scluster.Start(ctx, k8scluster.Config{BinDir: binDir, PauseTar: w("pause.tar"), Log: os.Stderr,
		// The agents' pins (the DaemonSet's, the services tests'):
		// removed at teardown if a test left them.
		Pins: []string{pinPath, svcPin, npPin, bpnPin}})
	if err != nil {
		fail("%v", err)
	}
	defer func() {
		if os.Getenv("EZTUNNEL_K8S_KEEP") != "" { // debugging: the next run's Start cleans up
			fmt.Fprintf(os.Stderr, "k8s: cluster kept running (EZTUNNEL_K8S_KEEP): KUBECONFIG=%s\n", cl.Kubeconfig)
			return
		}
		if err := cl.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "k8s: FAIL: teardown:", err)
			code = 1
		}
	}()
	for _, tar := range []string{w("lab.tar"), w("agent1.tar"), w("agent2.tar")} {
		if err := cl.ImportImage(ctx, tar); err != nil {
			fmt.Fprintf(os.Stderr, "k8s: FAIL: import %s: %v\n", tar, err)
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "k8s: cluster up, images imported (%.0fs)\n", time.Since(t2).Seconds())
	return m.Run()
}

// kubeBins builds (or finds cached) the Kubernetes binaries.
func kubeBins() (string, error) {
	cmd := sysexec.Command(context.Background(), "../../tools/kube/build.sh")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

func goBuild(out, pkg string) error {
	cmd := sysexec.Command(context.Background(), "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=k8s-test", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}
