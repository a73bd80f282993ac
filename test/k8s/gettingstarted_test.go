//go:build k8s

package k8s

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/internal/toolbin"
)

// gettingStartedBusybox is the image docs/getting-started.md runs its pod
// pair with. The cluster has no registry access, so the test builds it from
// the host's static busybox (Debian busybox-static) under the same name:
// the applets the page uses, at /bin, PATH=/bin.
const gettingStartedBusybox = "docker.io/library/busybox:1.36"

// TestGettingStarted runs the shell blocks of docs/getting-started.md, in
// order, in one bash script from the repository's root, on this cluster:
// `make image`, the chart's install into kube-system, a selected namespace
// with a same-node busybox pair, and the check that eztunnel_pairs_total
// grew by the client's request ("accelerated"). What the page leaves to the
// reader is done here: the blocks marked `sh on-each-node` (the image's
// import into each node's containerd) by importing bin/eztunnel-image.tar,
// and the node's cgroup2 mount replaces the page's /sys/fs/cgroup. The
// helm and kubectl the script finds are the test's, with KUBECONFIG set.
// Afterwards it removes the namespace and the release and checks that the
// node holds nothing of eztunnel.
func TestGettingStarted(tt *testing.T) {
	t := summarized(tt)
	if l := leftovers(); len(l) > 0 {
		t.Fatalf("eztunnel state before the install: %v", l)
	}
	repo, err := toolbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(repo, "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := shellBlocks(string(page))
	if len(blocks) < 4 {
		t.Fatalf("%d shell blocks in docs/getting-started.md: its format changed?", len(blocks))
	}

	// The commands the script finds: this test's helm and the cluster's kubectl.
	inst := newInstaller(t)
	tools := t.TempDir()
	for name, target := range map[string]string{"helm": inst.bin, "kubectl": filepath.Join(kubeBinDir, "kubectl")} {
		if err := os.Symlink(target, filepath.Join(tools, name)); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "KUBECONFIG="+cl.Kubeconfig, "PATH="+tools+":"+os.Getenv("PATH"))

	// The pods' image: busybox with the applets the page runs.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ezimage, err := toolbin.Build(ctx, repo, "ezimage")
	if err != nil {
		t.Fatalf("ezimage: %v", err)
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Fatalf("the page's pods need a static busybox (Debian busybox-static, scripts/install-deps.sh k8s): %v", err)
	}
	bb := filepath.Join(t.TempDir(), "busybox.tar")
	args := []string{"--out", bb, "--name", gettingStartedBusybox, "--env", "PATH=/bin", "--cmd", "sh"}
	for _, applet := range []string{"busybox", "sh", "httpd", "sleep", "wget"} {
		args = append(args, "--file", "/bin/busybox:/bin/"+applet+":0755")
	}
	if out, err := sysexec.Command(ctx, ezimage, args...).CombinedOutput(); err != nil {
		t.Fatalf("busybox image: %v\n%s", err, out)
	}
	if err := cl.ImportImage(ctx, bb); err != nil {
		t.Fatalf("import busybox: %v", err)
	}

	t.Cleanup(func() {
		if t.Failed() {
			out, _ := cl.Kubectl(context.Background(), "-n", "kube-system", "logs", "daemonset/eztunnel", "--tail=50")
			t.Logf("agent log:\n%s", out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cl.Kubectl(ctx, "delete", "namespace", "demo", "--ignore-not-found", "--wait=true", "--timeout=90s")
		out, err := sysexec.Command(ctx, inst.bin, "uninstall", "eztunnel", "-n", "kube-system", "--wait", "--timeout", "3m", "--kubeconfig", cl.Kubeconfig).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "not found") {
			t.Errorf("helm uninstall: %v\n%s", err, out)
		}
		deadline := time.Now().Add(60 * time.Second)
		for len(leftovers()) > 0 && time.Now().Before(deadline) {
			time.Sleep(500 * time.Millisecond)
		}
		if l := leftovers(); len(l) > 0 {
			t.Errorf("eztunnel state left after helm uninstall: %v", l)
			sysexec.Command(ctx, filepath.Join(workDir, "eztunnel"), "uninstall", "--pin-path", pinPath).Run()
		}
	})

	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	imported := false
	for _, b := range blocks {
		switch b.info {
		case "sh":
			body := strings.ReplaceAll(b.body, "cgroup2Path=/sys/fs/cgroup", "cgroup2Path="+cg2Root)
			script.WriteString(body + "\n")
		case "sh on-each-node":
			// The script stops here, the test imports the image, and
			// the rest of the page runs as a second script.
			script.WriteString("#IMPORT\n")
			imported = true
		default:
			t.Fatalf("docs/getting-started.md: a block of %q: run it or say how the test stands in for it", b.info)
		}
	}
	if !imported {
		t.Fatal("docs/getting-started.md: no `sh on-each-node` block (the image's import): its format changed?")
	}
	parts := strings.SplitN(script.String(), "#IMPORT\n", 2)
	run := func(name, s string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
		defer cancel()
		cmd := sysexec.Command(ctx, "bash", "-c", s)
		cmd.Dir = repo
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		t.Logf("%s:\n%s\n--- output ---\n%s", name, s, out)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return string(out)
	}
	start := time.Now()
	run("docs/getting-started.md, up to the import", parts[0])
	if err := cl.ImportImage(ctx, filepath.Join(repo, "bin", "eztunnel-image.tar")); err != nil {
		t.Fatalf("import bin/eztunnel-image.tar: %v", err)
	}
	out := run("docs/getting-started.md, after the import", "set -euo pipefail\n"+parts[1])
	last := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	m := regexp.MustCompile(`eztunnel_pairs_total: ([0-9]+) -> ([0-9]+)`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "\naccelerated\n") {
		t.Fatalf("the page's check did not print the counter and \"accelerated\" (last line %q)", last)
	}
	t.Logf("docs/getting-started.md ran in %.0fs: eztunnel_pairs_total %s -> %s, accelerated", time.Since(start).Seconds(), m[1], m[2])
}

type shellBlock struct{ info, body string }

// shellBlocks returns the fenced blocks of a Markdown page whose info
// string starts with "sh", with the info string.
func shellBlocks(page string) []shellBlock {
	var out []shellBlock
	var cur *shellBlock
	for _, line := range strings.Split(page, "\n") {
		trim := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trim, "```"):
			info := strings.TrimSpace(strings.TrimPrefix(trim, "```"))
			cur = &shellBlock{info: info}
		case cur != nil && trim == "```":
			if cur.info == "sh" || strings.HasPrefix(cur.info, "sh ") {
				out = append(out, *cur)
			}
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		}
	}
	return out
}
