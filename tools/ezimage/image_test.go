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
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
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

// capture runs the CLI and returns what it printed.
func capture(t *testing.T, args ...string) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	err = run(args)
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatalf("ezimage %q: %v", args, err)
	}
	return string(out)
}

// perArch writes dir/linux-<arch>/agent for each arch, contents differing
// per arch, and returns the --file pattern naming them.
func perArch(t *testing.T, dir string, archs ...string) string {
	t.Helper()
	for _, a := range archs {
		os.MkdirAll(filepath.Join(dir, "linux-"+a), 0o755)
		writeFile(t, filepath.Join(dir, "linux-"+a, "agent"), bytes.Repeat([]byte("ELF for "+a+"\n"), 3000), 0o755)
	}
	return filepath.Join(dir, "{os}-{arch}", "agent") + ":/agent:0755"
}

// TestMultiPlatform builds an image for two platforms and reads it back:
// index.json names one OCI image index (the printed digest), which lists a
// manifest per platform, in the order given, with its platform; each image
// validates, has its platform in its config and holds its platform's file
// and the shared one; every blob is under blobs/sha256 by its digest, once;
// the docker side is the first platform's image.
func TestMultiPlatform(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	dir := t.TempDir()
	pattern := perArch(t, dir, "amd64", "arm64")
	conf := filepath.Join(dir, "conf")
	writeFile(t, conf, []byte("shared\n"), 0o644)
	archive := filepath.Join(dir, "img.tar")
	out := capture(t, "--out", archive, "--name", "example.org/x/agent:v1", "--platform", "linux/amd64", "--platform", "linux/arm64",
		"--file", pattern, "--file", conf+":/etc/conf", "--entrypoint", "/agent")
	raw, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}

	// The archive's entries: the layout's files and sha256 blobs, each once
	// and named by its digest.
	lay := filepath.Join(dir, "layout")
	hdrs := untar(t, raw, lay)
	names := map[string]int{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name]++
		b, _ := io.ReadAll(tr)
		switch hex, isBlob := strings.CutPrefix(h.Name, "blobs/sha256/"); {
		case h.Name == "oci-layout" || h.Name == "index.json" || h.Name == "manifest.json" || h.Name == "blobs/" || h.Name == "blobs/sha256/":
		case isBlob:
			if d, _, _ := v1.SHA256(bytes.NewReader(b)); d.Hex != hex {
				t.Errorf("blob %s has digest %s", h.Name, d)
			}
		default:
			t.Errorf("unexpected archive entry %s", h.Name)
		}
	}
	for n, c := range names {
		if c != 1 {
			t.Errorf("%s %d times in the archive", n, c)
		}
	}
	if len(hdrs) != len(names) {
		t.Errorf("%d entries, %d names", len(hdrs), len(names))
	}

	// index.json: one descriptor, the index, under the name.
	top, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 {
		t.Fatalf("index.json lists %d entries, want 1", len(tm.Manifests))
	}
	desc := tm.Manifests[0]
	if desc.MediaType != types.OCIImageIndex {
		t.Fatalf("index.json entry media type %s, want %s", desc.MediaType, types.OCIImageIndex)
	}
	if desc.Annotations["io.containerd.image.name"] != "example.org/x/agent:v1" || desc.Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Errorf("index.json annotations %v", desc.Annotations)
	}
	if f := strings.Fields(out); len(f) < 3 || f[0] != archive || f[1] != "example.org/x/agent:v1" || f[2] != desc.Digest.String() {
		t.Errorf("printed %q, want %s example.org/x/agent:v1 %s ...", out, archive, desc.Digest)
	}
	if err := validate.Index(top); err != nil {
		t.Errorf("validate the layout: %v", err)
	}
	idx, err := top.ImageIndex(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Errorf("validate the index: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %s", im.MediaType)
	}
	want := []string{"linux/amd64", "linux/arm64"}
	var got []string
	for _, m := range im.Manifests {
		if m.Platform == nil {
			t.Fatalf("manifest %s without a platform", m.Digest)
		}
		got = append(got, m.Platform.String())
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("index platforms %v, want %v", got, want)
	}

	var configs []v1.Hash
	for i, m := range im.Manifests {
		arch := m.Platform.Architecture
		if m.MediaType != types.OCIManifestSchema1 || m.ArtifactType != "" {
			t.Errorf("%s: descriptor media type %s, artifact type %q", arch, m.MediaType, m.ArtifactType)
		}
		if !strings.Contains(out, "\n  linux/"+arch+" "+m.Digest.String()+"\n") {
			t.Errorf("printed %q: no line for linux/%s %s", out, arch, m.Digest)
		}
		img, err := idx.Image(m.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(img); err != nil {
			t.Errorf("%s: validate: %v", arch, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != want[i][len("linux/"):] || cf.Variant != "" ||
			!reflect.DeepEqual(cf.Config.Entrypoint, []string{"/agent"}) || !cf.Created.Time.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s: config os %s arch %s variant %q entrypoint %v created %v", arch, cf.OS, cf.Architecture, cf.Variant,
				cf.Config.Entrypoint, cf.Created)
		}
		cn, _ := img.ConfigName()
		configs = append(configs, cn)
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %d layers, %v", arch, len(layers), err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{}
		ltr := tar.NewReader(rc)
		for {
			h, err := ltr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name], _ = io.ReadAll(ltr)
		}
		rc.Close()
		wantAgent, _ := os.ReadFile(filepath.Join(dir, "linux-"+arch, "agent"))
		if len(files) != 3 || !bytes.Equal(files["agent"], wantAgent) || string(files["etc/conf"]) != "shared\n" {
			t.Errorf("%s: layer holds %d entries, agent %.20q, etc/conf %q", arch, len(files), files["agent"], files["etc/conf"])
		}
	}

	// The docker side: the first platform's image.
	timg, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cn, err := timg.ConfigName(); err != nil || cn != configs[0] {
		t.Errorf("docker side config %s (%v), want linux/amd64's %s", cn, err, configs[0])
	}
}

// TestMultiPlatformReproducible: the same inputs give the same archive
// (other mtimes, the other flags in another order); the time stamp and the
// platforms' order change the index digest.
func TestMultiPlatformReproducible(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	dir := t.TempDir()
	pattern := perArch(t, dir, "amd64", "arm64")
	conf := filepath.Join(dir, "conf")
	writeFile(t, conf, []byte("shared\n"), 0o644)
	args := []string{"--name", "x:v1", "--platform", "linux/amd64", "--platform", "linux/arm64", "--file", pattern,
		"--file", conf + ":/etc/conf", "--entrypoint", "/agent", "--label", "l=v"}
	one := build(t, filepath.Join(dir, "1.tar"), args...)
	future := time.Now().Add(time.Hour)
	for _, p := range []string{conf, filepath.Join(dir, "linux-amd64", "agent"), filepath.Join(dir, "linux-arm64", "agent")} {
		os.Chtimes(p, future, future)
	}
	two := build(t, filepath.Join(dir, "2.tar"), "--label", "l=v", "--file", conf+":/etc/conf", "--platform", "linux/amd64,linux/arm64",
		"--entrypoint", "/agent", "--file", pattern, "--name", "x:v1")
	if !bytes.Equal(one, two) {
		t.Fatalf("same inputs, different archives (%d and %d bytes)", len(one), len(two))
	}
	d1 := digestOf(t, one)
	if d := digestOf(t, build(t, filepath.Join(dir, "3.tar"), append(args[:2:2], append([]string{"--platform", "linux/arm64,linux/amd64"}, args[6:]...)...)...)); d == d1 {
		t.Errorf("the platforms in the other order kept digest %s", d)
	}
	t.Setenv("SOURCE_DATE_EPOCH", "1700000001")
	if d := digestOf(t, build(t, filepath.Join(dir, "4.tar"), args...)); d == d1 {
		t.Errorf("another SOURCE_DATE_EPOCH kept digest %s", d)
	}
}

// TestVariantPlaceholder: {variant} is the platform's variant, empty without
// one, and the config carries it.
func TestVariantPlaceholder(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"armv7", "arm64"} {
		writeFile(t, filepath.Join(dir, n), []byte(n), 0o755)
	}
	raw := build(t, filepath.Join(dir, "img.tar"), "--name", "x", "--platform", "linux/arm/v7,linux/arm64",
		"--file", filepath.Join(dir, "{arch}{variant}")+":/agent")
	lay := filepath.Join(dir, "layout")
	untar(t, raw, lay)
	top, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := top.ImageIndex(digestOf(t, raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatal(err)
	}
	im, _ := idx.IndexManifest()
	for i, want := range []string{"linux/arm/v7", "linux/arm64"} {
		if got := im.Manifests[i].Platform.String(); got != want {
			t.Errorf("manifest %d: platform %s, want %s", i, got, want)
		}
	}
	img, _ := idx.Image(im.Manifests[0].Digest)
	if cf, err := img.ConfigFile(); err != nil || cf.Architecture != "arm" || cf.Variant != "v7" {
		t.Errorf("linux/arm/v7 config %+v, %v", cf, err)
	}
}

// TestMultiPlatformBadInput: misspelt placeholders, a platform's missing
// file, platforms given twice fail and write nothing.
func TestMultiPlatformBadInput(t *testing.T) {
	dir := t.TempDir()
	pattern := perArch(t, dir, "amd64") // no linux-arm64/agent
	out := filepath.Join(dir, "out.tar")
	two := []string{"--platform", "linux/amd64", "--platform", "linux/arm64"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--file", filepath.Join(dir, "{OS}-{arch}", "agent") + ":/agent"}, `unknown placeholder "{OS}"`},
		{[]string{"--file", filepath.Join(dir, "{os}-{machine}", "agent") + ":/agent"}, `unknown placeholder "{machine}"`},
		{[]string{"--file", filepath.Join(dir, "{os", "agent") + ":/agent"}, `unknown placeholder "{os/agent"`},
		{[]string{"--file", filepath.Join(dir, "{os}-{arch}", "agent") + ":/{arch}"}, "placeholder {arch} in DST"},
		{append([]string{"--file", pattern}, two...), "platform linux/arm64: --file " + filepath.Join(dir, "linux-arm64", "agent") +
			" (from " + filepath.Join(dir, "{os}-{arch}", "agent") + "): stat"},
		{append([]string{"--file", pattern}, two...), "no such file"},
		{[]string{"--file", pattern, "--platform", "linux/amd64", "--platform", "linux/amd64"}, "--platform linux/amd64 given twice"},
		{[]string{"--file", pattern, "--platform", "linux/amd64,linux/arm64,linux/amd64"}, "--platform linux/amd64 given twice"},
		{[]string{"--file", pattern, "--platform", "linux/arm64/v8,linux/arm64"}, "--platform linux/arm64: the same platform as linux/arm64/v8"},
		{[]string{"--file", pattern, "--platform", "linux/amd64,"}, "--platform"},
		{[]string{"--file", pattern, "--platform", "linux/amd64,linux"}, `--platform "linux"`},
	} {
		err := run(append([]string{"--out", out, "--name", "x"}, c.args...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.args, err, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%q: wrote %s despite the error", c.args, out)
		}
	}
}

// TestSharedBlob: two platforms with the same files share the layer blob,
// which the archive holds once; the layout still reads and validates.
func TestSharedBlob(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "script")
	writeFile(t, f, []byte("#!/bin/sh\n"), 0o755)
	raw := build(t, filepath.Join(dir, "img.tar"), "--name", "x", "--platform", "linux/amd64,linux/arm64", "--file", f+":/script")
	lay := filepath.Join(dir, "layout")
	untar(t, raw, lay)
	names := map[string]int{}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if names[h.Name]++; names[h.Name] > 1 {
			t.Errorf("%s twice in the archive", h.Name)
		}
	}
	top, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := top.ImageIndex(digestOf(t, raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatal(err)
	}
	im, _ := idx.IndexManifest()
	var layers []v1.Hash
	for _, m := range im.Manifests {
		img, _ := idx.Image(m.Digest)
		ls, err := img.Layers()
		if err != nil || len(ls) != 1 {
			t.Fatalf("%d layers, %v", len(ls), err)
		}
		d, _ := ls[0].Digest()
		layers = append(layers, d)
	}
	if len(layers) != 2 || layers[0] != layers[1] {
		t.Errorf("layers %v: want the same blob for both platforms", layers)
	}
}
