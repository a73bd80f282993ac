package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

var time0 = time.Unix(1, 0)

// The OCI media types of the archive's blobs (image-spec v1.1).
const (
	ociIndex     = "application/vnd.oci.image.index.v1+json"
	ociManifest  = "application/vnd.oci.image.manifest.v1+json"
	ociConfig    = "application/vnd.oci.image.config.v1+json"
	ociLayer     = "application/vnd.oci.image.layer.v1.tar"
	ociLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// What the tests' images are built with: the name, a fixed build time (as
// make image's commit time) and the agent's path in the image.
const (
	imageName      = "ghcr.io/eztunnel/eztunnel:test"
	sourceDateEnv  = "SOURCE_DATE_EPOCH=1700000000"
	agentImageFile = "/eztunnel"
)

// elfMachine is the ELF machine of GOARCH's binaries: an image's agent must
// run on the platform its manifest is listed under.
var elfMachine = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM,
	"386": elf.EM_386, "riscv64": elf.EM_RISCV, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390,
}

// files reads a tar into name -> contents (directories as nil).
func files(t *testing.T, r io.Reader) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	out, hdrs := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name], hdrs[h.Name] = b, h
	}
}

// descriptor is an OCI content descriptor, as index.json, an image index and
// a manifest name blobs. Platform stays a map so that a field the test does
// not expect (a variant, os.version) shows.
type descriptor struct {
	MediaType   string
	Digest      string
	Size        int64
	Platform    map[string]any
	Annotations map[string]string
}

// ociArchive is an image archive's entries by name (the OCI layout's
// oci-layout, index.json and blobs/sha256/<hex>, and the docker side's
// manifest.json).
type ociArchive map[string][]byte

// readArchive reads an image archive and checks that every blob hashes to
// its name: what a registry or containerd verifies on push or import.
func readArchive(t *testing.T, b []byte) ociArchive {
	t.Helper()
	a, _ := files(t, bytes.NewReader(b))
	for n, b := range a {
		h, ok := strings.CutPrefix(n, "blobs/sha256/")
		if !ok || h == "" {
			continue
		}
		if sum := sha256.Sum256(b); h != hex.EncodeToString(sum[:]) {
			t.Errorf("blob %s holds sha256:%x", n, sum)
		}
	}
	return a
}

// blob returns the blob d names, which must have d's size.
func (a ociArchive) blob(t *testing.T, d descriptor) []byte {
	t.Helper()
	b, ok := a["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
	if !ok || !strings.HasPrefix(d.Digest, "sha256:") {
		t.Fatalf("blob %s missing", d.Digest)
	}
	if int64(len(b)) != d.Size {
		t.Errorf("blob %s: %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b
}

// imageIndex is an OCI image index: index.json, and the multi-platform
// image's index blob.
type imageIndex struct {
	SchemaVersion int
	MediaType     string
	Manifests     []descriptor
}

// top reads index.json: its one entry (the index or the only image) must be
// of mediaType, named imageName, and is returned.
func (a ociArchive) top(t *testing.T, mediaType string) descriptor {
	t.Helper()
	var index imageIndex
	if err := json.Unmarshal(a["index.json"], &index); err != nil || len(index.Manifests) != 1 ||
		index.SchemaVersion != 2 || index.MediaType != ociIndex {
		t.Fatalf("index.json %s: %v", a["index.json"], err)
	}
	d := index.Manifests[0]
	if d.MediaType != mediaType || d.Annotations["io.containerd.image.name"] != imageName ||
		d.Annotations["org.opencontainers.image.ref.name"] != "test" {
		t.Errorf("index.json entry %+v, want a %s named %s", d, mediaType, imageName)
	}
	return d
}

// imageManifest is an OCI image manifest's fields the tests read.
type imageManifest struct {
	SchemaVersion int
	MediaType     string
	Config        descriptor
	Layers        []descriptor
}

// checkAgentImage checks the image manifest d names is the agent's image for
// linux/<arch>: a config of that platform with /eztunnel as entrypoint, run as
// user 0, and one layer (gzip or plain tar, by its media type) holding only
// /eztunnel, mode 0755 owned by 0:0, a static ELF binary of that arch with
// exactly want's bytes. It returns the manifest.
func checkAgentImage(t *testing.T, a ociArchive, d descriptor, arch string, want []byte) imageManifest {
	t.Helper()
	var m imageManifest
	if err := json.Unmarshal(a.blob(t, d), &m); err != nil || len(m.Layers) != 1 {
		t.Fatalf("linux/%s manifest: %v, %d layers", arch, err, len(m.Layers))
	}
	if d.MediaType != ociManifest || m.MediaType != ociManifest || m.SchemaVersion != 2 || m.Config.MediaType != ociConfig {
		t.Errorf("linux/%s manifest %s (descriptor %s), config %s", arch, m.MediaType, d.MediaType, m.Config.MediaType)
	}
	var config struct {
		Architecture, OS, Variant string
		Config                    struct {
			Entrypoint, Cmd []string
			User            string
		}
	}
	if err := json.Unmarshal(a.blob(t, m.Config), &config); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(config.Config.Entrypoint, []string{agentImageFile}) || config.Config.Cmd != nil ||
		config.Config.User != "0" || config.OS != "linux" || config.Architecture != arch || config.Variant != "" {
		t.Errorf("linux/%s image config %+v", arch, config)
	}

	// The layer, compressed or not as its media type says.
	var r io.Reader = bytes.NewReader(a.blob(t, m.Layers[0]))
	switch mt := m.Layers[0].MediaType; mt {
	case ociLayerGzip:
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	case ociLayer:
	default:
		t.Fatalf("linux/%s layer media type %s", arch, mt)
	}
	layer, hdrs := files(t, r)
	if len(layer) != 1 || hdrs["eztunnel"] == nil {
		names := []string{}
		for n := range layer {
			names = append(names, n)
		}
		t.Fatalf("linux/%s layer holds %v, want only eztunnel", arch, names)
	}
	if h := hdrs["eztunnel"]; h.Typeflag != tar.TypeReg || h.Mode != 0o755 || h.Uid != 0 || h.Gid != 0 {
		t.Errorf("linux/%s eztunnel entry type %c mode %o uid %d gid %d", arch, h.Typeflag, h.Mode, h.Uid, h.Gid)
	}
	bin := layer["eztunnel"]
	if !bytes.Equal(bin, want) {
		t.Errorf("linux/%s: the image's /eztunnel (%d bytes) differs from the agent built for it (%d bytes)", arch, len(bin), len(want))
	}

	// The platform's machine code, static: no program interpreter (the
	// image has no libc or loader).
	ef, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("linux/%s /eztunnel: %v", arch, err)
	}
	if wm, ok := elfMachine[arch]; !ok {
		t.Fatalf("no ELF machine known for GOARCH %s", arch)
	} else if ef.Machine != wm {
		t.Errorf("linux/%s /eztunnel is a %s binary, want %s", arch, ef.Machine, wm)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("linux/%s: the agent binary is dynamically linked: the image has no loader", arch)
		}
	}
	return m
}

// buildImage runs ezimage twice with args (--out added), the second time with
// the inputs' mtimes changed, as two builds of one commit would, and checks
// both give the same printed lines (less OUT) and the same archive bytes. It
// returns the digest of the first line, OUT NAME DIGEST, the further
// (per-platform) lines, and the archive.
func buildImage(t *testing.T, inputs []string, args ...string) (string, []string, []byte) {
	t.Helper()
	ezimage := tool(t, "ezimage")
	dir := t.TempDir()
	var outs [][]string
	var archives [][]byte
	for i := range 2 {
		out := filepath.Join(dir, "image"+string(rune('0'+i))+".tar")
		cmd := sysexec.Command(t.Context(), ezimage, append([]string{"--out", out}, args...)...)
		cmd.Env = append(os.Environ(), sourceDateEnv)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		o, err := cmd.Output()
		if err != nil || stderr.Len() > 0 {
			t.Fatalf("ezimage: %v\n%s%s", err, o, stderr.Bytes())
		}
		lines := strings.Split(strings.TrimSuffix(string(o), "\n"), "\n")
		f := strings.Fields(lines[0])
		if len(f) < 3 || f[0] != out || f[1] != imageName || !strings.HasPrefix(f[2], "sha256:") {
			t.Fatalf("ezimage printed %q, want OUT NAME DIGEST", o)
		}
		lines[0] = f[2]
		outs = append(outs, lines)
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
		// Other mtimes of the same binaries for the second build.
		for _, in := range inputs {
			os.Chtimes(in, time0, time0)
		}
	}
	if !reflect.DeepEqual(outs[0], outs[1]) || !bytes.Equal(archives[0], archives[1]) {
		t.Fatalf("two builds of the same binaries: printed %q and %q", outs[0], outs[1])
	}
	t.Logf("image digest %s, archive %d bytes", outs[0][0], len(archives[0]))
	return outs[0][0], outs[0][1:], archives[0]
}

// TestAgentImage builds the agent's image twice from the static agent binary,
// as `make image` does for one platform, and checks the digests are equal and
// the image holds the agent only, as its entrypoint, run as user 0.
func TestAgentImage(t *testing.T) {
	bin := agent(t)
	digest, more, archive := buildImage(t, []string{bin}, "--name", imageName,
		"--file", bin+":"+agentImageFile+":0755", "--entrypoint", agentImageFile, "--platform", "linux/"+runtime.GOARCH)
	if len(more) != 0 {
		t.Errorf("one platform: ezimage printed per-platform lines %q", more)
	}
	a := readArchive(t, archive)
	// One platform: index.json names the image itself, no index.
	top := a.top(t, ociManifest)
	if top.Digest != digest {
		t.Errorf("index.json names %s, ezimage printed %s", top.Digest, digest)
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	checkAgentImage(t, a, top, runtime.GOARCH, want)
}

// agentFor puts the static agent for linux/<arch> at
// <dir>/linux-<arch>/eztunnel, the layout of make image's
// bin/{os}-{arch}{variant}/eztunnel, and returns its bytes. It is built as
// agent's (same flags, GOOS and GOARCH set as the Makefile does per
// platform); for the host's platform it is agent's binary: one build fewer.
func agentFor(t *testing.T, dir, arch string) []byte {
	t.Helper()
	out := filepath.Join(dir, "linux-"+arch, "eztunnel")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" && arch == runtime.GOARCH {
		b, err := os.ReadFile(agent(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, b, 0o755); err != nil {
			t.Fatal(err)
		}
		return b
	}
	start := time.Now()
	cmd := sysexec.Command(t.Context(), "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=deploy-test",
		"-o", out, "./cmd/eztunnel")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0")
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the agent for linux/%s: %v\n%s", arch, err, o)
	}
	t.Logf("built the agent for linux/%s in %v", arch, time.Since(start).Round(time.Millisecond))
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAgentImageIndex builds the multi-platform image as `make image` does:
// the agent for linux/amd64 and linux/arm64 under <dir>/linux-<arch>/, one
// ezimage run with both --platform and --file '<dir>/{os}-{arch}{variant}/
// eztunnel:...', twice. It checks the printed digest is reproducible and is
// that of the OCI image index index.json names, which lists exactly one
// manifest per platform, each with its platform and that platform's agent;
// and that the docker save side holds the first platform's image.
func TestAgentImageIndex(t *testing.T) {
	platforms := []string{"linux/amd64", "linux/arm64"}
	dir := t.TempDir()
	bins := map[string][]byte{}
	var inputs []string
	args := []string{"--name", imageName, "--entrypoint", agentImageFile,
		"--file", filepath.Join(dir, "{os}-{arch}{variant}", "eztunnel") + ":" + agentImageFile + ":0755"}
	for _, p := range platforms {
		arch := path.Base(p)
		bins[p] = agentFor(t, dir, arch)
		inputs = append(inputs, filepath.Join(dir, "linux-"+arch, "eztunnel"))
		args = append(args, "--platform", p)
	}
	digest, more, archive := buildImage(t, inputs, args...)
	a := readArchive(t, archive)

	// index.json names the index by the printed digest.
	top := a.top(t, ociIndex)
	if top.Digest != digest {
		t.Fatalf("index.json names %s, ezimage printed %s", top.Digest, digest)
	}
	var index imageIndex
	if err := json.Unmarshal(a.blob(t, top), &index); err != nil {
		t.Fatal(err)
	}
	if index.SchemaVersion != 2 || index.MediaType != ociIndex || len(index.Manifests) != len(platforms) {
		t.Fatalf("image index %s", a.blob(t, top))
	}
	if len(more) != len(platforms) {
		t.Fatalf("ezimage printed per-platform lines %q, want one per platform", more)
	}
	// One manifest per platform, in the order given, with exactly that
	// platform (no variant), ezimage's line naming it, and its agent.
	var manifests []imageManifest
	for i, p := range platforms {
		d := index.Manifests[i]
		arch := path.Base(p)
		if want := map[string]any{"os": "linux", "architecture": arch}; !reflect.DeepEqual(d.Platform, want) {
			t.Errorf("index manifest %d: platform %v, want %v", i, d.Platform, want)
		}
		if line := "  " + p + " " + d.Digest; more[i] != line {
			t.Errorf("ezimage printed %q, want %q", more[i], line)
		}
		manifests = append(manifests, checkAgentImage(t, a, d, arch, bins[p]))
	}

	// The docker save side cannot hold an index: the first platform's image.
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(a["manifest.json"], &docker); err != nil || len(docker) != 1 {
		t.Fatalf("manifest.json %s: %v", a["manifest.json"], err)
	}
	first := manifests[0]
	blobName := func(d descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }
	if d := docker[0]; d.Config != blobName(first.Config) || !reflect.DeepEqual(d.Layers, []string{blobName(first.Layers[0])}) ||
		!reflect.DeepEqual(d.RepoTags, []string{imageName}) {
		t.Errorf("manifest.json %+v, want %s's image %+v", d, platforms[0], first)
	}
}
