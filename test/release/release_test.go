//go:build release

// Package release tests `make release` (make test-release): every artefact
// is there, checksummed, the chart pins the image it ships with, and the
// SBOMs list what each binary links.
package release

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

func TestRelease(t *testing.T) {
	dist := filepath.Join(t.TempDir(), "dist")
	ctx := context.Background()
	mk := sysexec.Command(ctx, "make", "-C", "../..", "release")
	mk.Env = append(os.Environ(), "DIST="+dist)
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	names, err := filepath.Glob(filepath.Join(dist, "*"))
	if err != nil {
		t.Fatal(err)
	}
	var base []string
	for _, n := range names {
		base = append(base, filepath.Base(n))
	}
	for _, pat := range []string{`^eztunnel-image-.+\.tar$`, `^eztunnel-0\.1\.0-g.+\.tgz$|^eztunnel-\d+\.\d+\.\d+.*\.tgz$`,
		`^kubectl-eztunnel-linux-amd64$`, `^kubectl-eztunnel-linux-arm64$`, `^kubectl-eztunnel-linux-amd64\.cdx\.json$`,
		`^eztunnel-linux-amd64\.cdx\.json$`, `^eztunnel-linux-arm64\.cdx\.json$`, `^SHA256SUMS$`} {
		if !slices.ContainsFunc(base, regexp.MustCompile(pat).MatchString) {
			t.Errorf("no artefact matching %s in %v", pat, base)
		}
	}
	sum := sysexec.Command(ctx, "sha256sum", "-c", "SHA256SUMS")
	sum.Dir = dist
	if out, err := sum.CombinedOutput(); err != nil || strings.Count(string(out), ": OK") != len(base)-1 {
		t.Errorf("sha256sum -c: %v\n%s", err, out)
	}

	// The packaged chart's default image is the archive's, by digest.
	values, err := os.ReadFile("../../bin/eztunnel-image.values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	digest := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(string(values))
	chart, _ := filepath.Glob(filepath.Join(dist, "eztunnel-*.tgz"))
	if len(chart) != 1 || digest == "" {
		t.Fatalf("chart %v, digest %q", chart, digest)
	}
	if v := fileInTgz(t, chart[0], "eztunnel/values.yaml"); !strings.Contains(v, "  digest: "+digest+"\n") {
		t.Errorf("the packaged chart's values do not pin %s:\n%s", digest, v)
	}

	// Each SBOM names its binary's modules: the agent links cilium/ebpf and
	// no lab plotting library, the plugin client-go.
	for file, want := range map[string][2]string{
		"eztunnel-linux-amd64.cdx.json":         {"github.com/cilium/ebpf", "gonum.org/v1/plot"},
		"kubectl-eztunnel-linux-amd64.cdx.json": {"k8s.io/client-go", "gonum.org/v1/plot"},
	} {
		var bom struct {
			BOMFormat  string `json:"bomFormat"`
			Components []struct {
				Name string `json:"name"`
			} `json:"components"`
		}
		b, err := os.ReadFile(filepath.Join(dist, file))
		if err != nil || json.Unmarshal(b, &bom) != nil || bom.BOMFormat != "CycloneDX" {
			t.Fatalf("%s: %v %s", file, err, b[:min(len(b), 200)])
		}
		has := func(n string) bool {
			return slices.ContainsFunc(bom.Components, func(c struct {
				Name string `json:"name"`
			}) bool {
				return c.Name == n
			})
		}
		if !has(want[0]) || has(want[1]) {
			t.Errorf("%s: %d components; want %s, not %s", file, len(bom.Components), want[0], want[1])
		}
	}
	if runtime.GOARCH == "amd64" {
		out, err := sysexec.Command(ctx, filepath.Join(dist, "kubectl-eztunnel-linux-amd64"), "--help").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "connectivity") {
			t.Errorf("the plugin: %v\n%s", err, out)
		}
	}
}

func fileInTgz(t *testing.T, path, name string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s in %s: %v", name, path, err)
		}
		if h.Name == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
}
