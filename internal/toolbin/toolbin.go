// Package toolbin builds the repository's tools modules (tools/<name>, each
// its own Go module so the agent's go.mod stays free of their dependencies)
// into a cache outside the repository and returns the binary's path. The
// cache key hashes every file of the tool's directory and its build recipe,
// so a changed go.sum or source builds a new binary and an unchanged one is
// reused.
package toolbin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// Tool is one tools module and how to build its binary.
type Tool struct {
	Name string
	// Pkg is the package `go build` builds, inside the tool's module.
	Pkg string
	// LDFlags beyond -s -w.
	LDFlags string
}

// Tools lists what Build knows.
var Tools = map[string]Tool{
	// helm.sh/helm/v3 as its Makefile builds the release: the version and the
	// Kubernetes version `helm template` and `helm lint` assume (the k8s.io
	// modules' v0.33 = Kubernetes 1.33).
	"helm": {Name: "helm", Pkg: "helm.sh/helm/v3/cmd/helm", LDFlags: "-X helm.sh/helm/v3/internal/version.version=v3.18.6" +
		" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=33" +
		" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=33"},
	"ezimage": {Name: "ezimage", Pkg: "."},
	// cyclonedx-gomod: the SBOMs of `make release`.
	"sbom": {Name: "sbom", Pkg: "github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod"},
	// Prometheus' PromQL parser, for the chart's dashboard and alert tests.
	"promql": {Name: "promql", Pkg: "."},
}

// CacheDir is where built tools live: $EZTUNNEL_TOOLS_CACHE, else
// /var/cache/eztunnel/tools when writable (root), else the user's cache.
func CacheDir() string {
	if d := os.Getenv("EZTUNNEL_TOOLS_CACHE"); d != "" {
		return d
	}
	d := "/var/cache/eztunnel/tools"
	if os.MkdirAll(d, 0o755) == nil {
		if f, err := os.CreateTemp(d, ".probe"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return d
		}
	}
	if uc, err := os.UserCacheDir(); err == nil {
		return filepath.Join(uc, "eztunnel", "tools")
	}
	return filepath.Join(os.TempDir(), "eztunnel-tools")
}

// RepoRoot finds the repository root (the directory holding tools/) from
// the working directory upwards.
func RepoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if st, err := os.Stat(filepath.Join(d, "tools")); err == nil && st.IsDir() {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				return d, nil
			}
		}
		p := filepath.Dir(d)
		if p == d {
			return "", fmt.Errorf("toolbin: no repository root (a directory with go.mod and tools/) above the working directory")
		}
		d = p
	}
}

// Key hashes the tool's directory (every file, by path and content) and its
// recipe.
func Key(repo string, t Tool) (string, error) {
	dir := filepath.Join(repo, "tools", t.Name)
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("toolbin: %s: %w", t.Name, err)
	}
	sort.Strings(files)
	h := sha256.New()
	fmt.Fprintf(h, "pkg %s\nldflags %s\n", t.Pkg, t.LDFlags)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(dir, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Build returns the cached binary of tools/<name>, building it first when
// the cache has none for the current sources.
func Build(ctx context.Context, repo, name string) (string, error) {
	t, ok := Tools[name]
	if !ok {
		names := make([]string, 0, len(Tools))
		for n := range Tools {
			names = append(names, n)
		}
		sort.Strings(names)
		return "", fmt.Errorf("toolbin: unknown tool %q (known: %s)", name, strings.Join(names, ", "))
	}
	key, err := Key(repo, t)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(CacheDir(), t.Name+"-"+key)
	out := filepath.Join(dir, t.Name)
	if st, err := os.Stat(out); err == nil && st.Mode()&0o111 != 0 {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("toolbin: %w", err)
	}
	// Build beside the final name and rename, so a concurrent or killed
	// build never leaves a partial binary at out.
	tmp, err := os.CreateTemp(dir, "."+t.Name+"-*")
	if err != nil {
		return "", fmt.Errorf("toolbin: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cmd := sysexec.Command(ctx, "go", "build", "-C", filepath.Join(repo, "tools", t.Name), "-trimpath",
		"-ldflags", strings.TrimSpace("-s -w "+t.LDFlags), "-o", tmp.Name(), t.Pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly", "GOSUMDB=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("toolbin: building %s: %v\n%s", t.Name, err, b)
	}
	if err := os.Chmod(tmp.Name(), 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return "", fmt.Errorf("toolbin: %w", err)
	}
	return out, nil
}
