package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// build runs the CLI as a user would and returns the archive's bytes and
// the printed digest.
func build(t *testing.T, out string, args ...string) []byte {
	t.Helper()
	if err := run(append([]string{"--out", out}, args...)); err != nil {
		t.Fatalf("ezimage %q: %v", args, err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, p string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

// untar extracts an archive's regular files into a map and a directory.
func untar(t *testing.T, b []byte, dir string) map[string]*tar.Header {
	t.Helper()
	hdrs := map[string]*tar.Header{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name] = h
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		writeFile(t, p, data, 0o644)
	}
}

func TestReproducibleDigest(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "")
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	writeFile(t, a, bytes.Repeat([]byte("agent"), 10000), 0o755)
	writeFile(t, b, []byte("config\n"), 0o600)
	args := []string{"--name", "example.org/x/y:v1", "--file", a + ":/bin/agent", "--file", b + ":/etc/y/conf:0644",
		"--dir", "/tmp:1777", "--entrypoint", "/bin/agent", "--cmd", "run", "--env", "A=1", "--label", "l=v"}
	one := build(t, filepath.Join(dir, "1.tar"), args...)
	// Different host metadata for the same contents: mtimes, and the
	// arguments in another order.
	future := time.Now().Add(time.Hour)
	os.Chtimes(a, future, future)
	os.Chtimes(b, future, future)
	two := build(t, filepath.Join(dir, "2.tar"), "--file", b+":/etc/y/conf:0644", "--label", "l=v", "--dir", "/tmp:1777",
		"--name", "example.org/x/y:v1", "--file", a+":/bin/agent", "--entrypoint", "/bin/agent", "--cmd", "run", "--env", "A=1")
	if !bytes.Equal(one, two) {
		t.Fatalf("same inputs, different archives (%d and %d bytes)", len(one), len(two))
	}
	d1 := digestOf(t, one)
	if !strings.HasPrefix(d1.String(), "sha256:") {
		t.Fatalf("digest %q", d1)
	}

	// Each input changes the digest.
	writeFile(t, b, []byte("config2\n"), 0o600)
	if d := digestOf(t, build(t, filepath.Join(dir, "3.tar"), args...)); d == d1 {
		t.Errorf("changed file contents kept digest %s", d)
	}
	writeFile(t, b, []byte("config\n"), 0o600)
	if d := digestOf(t, build(t, filepath.Join(dir, "4.tar"), args...)); d != d1 {
		t.Errorf("restored contents: digest %s, want %s", d, d1)
	}
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	if d := digestOf(t, build(t, filepath.Join(dir, "5.tar"), args...)); d == d1 {
		t.Errorf("SOURCE_DATE_EPOCH kept digest %s", d)
	}
}

// digestOf reads the image digest from the archive's index.json.
func digestOf(t *testing.T, b []byte) v1.Hash {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no index.json: %v", err)
		}
		if h.Name == "index.json" {
			var idx v1.IndexManifest
			if err := json.NewDecoder(tr).Decode(&idx); err != nil {
				t.Fatal(err)
			}
			if len(idx.Manifests) != 1 {
				t.Fatalf("index has %d manifests", len(idx.Manifests))
			}
			return idx.Manifests[0].Digest
		}
	}
}

// TestArchiveFormats reads the archive back the ways its users do: as an OCI
// layout (ctr import, skopeo oci-archive:) and as a docker save tarball
// (crane push, docker load), and checks the layer holds exactly the files,
// owned by 0:0 with the fixed time stamp.
func TestArchiveFormats(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	for _, uncompressed := range []bool{false, true} {
		dir := t.TempDir()
		bin := filepath.Join(dir, "agent")
		writeFile(t, bin, bytes.Repeat([]byte{0x7f, 'E', 'L', 'F'}, 5000), 0o700)
		args := []string{"--name", "agent", "--file", bin + ":/agent:0755", "--entrypoint", "/agent", "--env", "PATH=/",
			"--platform", "linux/arm64/v8"}
		if uncompressed {
			args = append(args, "--uncompressed")
		}
		archive := filepath.Join(dir, "img.tar")
		raw := build(t, archive, args...)
		want := digestOf(t, raw)

		// OCI layout.
		lay := filepath.Join(dir, "layout")
		hdrs := untar(t, raw, lay)
		for n, h := range hdrs {
			if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(time.Unix(1700000000, 0)) {
				t.Errorf("archive entry %s: uid %d gid %d %q %q mtime %v", n, h.Uid, h.Gid, h.Uname, h.Gname, h.ModTime)
			}
		}
		idx, err := layout.ImageIndexFromPath(lay)
		if err != nil {
			t.Fatal(err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		if got := im.Manifests[0].Annotations["io.containerd.image.name"]; got != "docker.io/library/agent:latest" {
			t.Errorf("containerd name %q", got)
		}
		img, err := idx.Image(want)
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := img.Digest(); d != want {
			t.Errorf("layout image digest %s, want %s", d, want)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/agent"}) || cf.Config.User != "0" || cf.OS != "linux" ||
			cf.Architecture != "arm64" || cf.Variant != "v8" || !reflect.DeepEqual(cf.Config.Env, []string{"PATH=/"}) {
			t.Errorf("config %+v", cf)
		}
		if !cf.Created.Time.Equal(time.Unix(1700000000, 0)) || len(cf.History) != 1 {
			t.Errorf("created %v, history %+v", cf.Created, cf.History)
		}
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("layers %d %v", len(layers), err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		lb, _ := io.ReadAll(rc)
		rc.Close()
		entries := untar(t, lb, "")
		if len(entries) != 1 || entries["agent"] == nil {
			t.Fatalf("layer entries %v, want only agent", entries)
		}
		if h := entries["agent"]; h.Mode != 0o755 || h.Uid != 0 || h.Size != 20000 {
			t.Errorf("agent entry %+v", h)
		}

		// docker save tarball, as crane push reads it: the same config and
		// layer blobs.
		timg, err := tarball.ImageFromPath(archive, nil)
		if err != nil {
			t.Fatal(err)
		}
		cn1, _ := img.ConfigName()
		cn2, err := timg.ConfigName()
		if err != nil || cn1 != cn2 {
			t.Errorf("docker tarball config %s (%v), OCI %s", cn2, err, cn1)
		}
		tl, err := timg.Layers()
		if err != nil || len(tl) != 1 {
			t.Fatalf("docker tarball layers %d %v", len(tl), err)
		}
		// A plain-tar layer is gzipped by the tarball reader (crane pushes it
		// compressed): the same contents (diff ID), another blob.
		d1, _ := layers[0].DiffID()
		d2, _ := tl[0].DiffID()
		if !uncompressed {
			d1, _ = layers[0].Digest()
			d2, _ = tl[0].Digest()
		}
		if d1 != d2 {
			t.Errorf("docker tarball layer %s, OCI %s", d2, d1)
		}
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	writeFile(t, f, []byte("x"), 0o644)
	out := filepath.Join(dir, "out.tar")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--name", "x"}, "no --file"},
		{[]string{"--file", f + ":/f"}, "--out and --name are required"},
		{[]string{"--name", "x", "--file", f}, "want SRC:DST"},
		{[]string{"--name", "x", "--file", f + ":rel"}, "absolute"},
		{[]string{"--name", "x", "--file", f + ":/f:999"}, "octal"},
		{[]string{"--name", "x", "--file", dir + "/missing:/f"}, "no such file"},
		{[]string{"--name", "x", "--file", dir + ":/f"}, "not a regular file"},
		{[]string{"--name", "x", "--file", f + ":/f", "--file", f + ":/f"}, "already in the image"},
		{[]string{"--name", "x", "--file", f + ":/a", "--file", f + ":/a/b"}, "both a file and a directory"},
		{[]string{"--name", "x@sha256:" + strings.Repeat("0", 64), "--file", f + ":/f"}, "not a digest"},
		{[]string{"--name", "UPPER", "--file", f + ":/f"}, "--name"},
		{[]string{"--name", "x", "--file", f + ":/f", "--platform", "linux"}, "--platform"},
		{[]string{"--name", "x", "--file", f + ":/f", "--env", "novalue"}, "--env"},
	} {
		err := run(append([]string{"--out", out}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.args, err, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%q: wrote %s despite the error", c.args, out)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".out.tar-*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
