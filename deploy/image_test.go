package deploy

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

var time0 = time.Unix(1, 0)

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

// TestAgentImage builds the agent's image twice from the static agent binary,
// as `make image` does, and checks the digests are equal and the image holds
// the agent only, as its entrypoint, run as user 0.
func TestAgentImage(t *testing.T) {
	bin := agent(t)
	ezimage := tool(t, "ezimage")
	dir := t.TempDir()
	var digests []string
	var archives [][]byte
	for i := range 2 {
		out := filepath.Join(dir, "image"+string(rune('0'+i))+".tar")
		cmd := sysexec.Command(t.Context(), ezimage, "--out", out, "--name", "ghcr.io/eztunnel/eztunnel:test",
			"--file", bin+":/eztunnel:0755", "--entrypoint", "/eztunnel", "--platform", "linux/"+runtime.GOARCH)
		cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=1700000000")
		o, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("ezimage: %v\n%s", err, o)
		}
		f := strings.Fields(string(o))
		if len(f) < 3 || !strings.HasPrefix(f[2], "sha256:") {
			t.Fatalf("ezimage printed %q, want OUT NAME DIGEST", o)
		}
		digests = append(digests, f[2])
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, b)
		// Another mtime of the same binary for the second build.
		os.Chtimes(bin, time0, time0)
	}
	if digests[0] != digests[1] || !bytes.Equal(archives[0], archives[1]) {
		t.Fatalf("two builds of the same binary: digests %s and %s", digests[0], digests[1])
	}
	t.Logf("agent image digest %s, archive %d bytes", digests[0], len(archives[0]))

	blobs, _ := files(t, bytes.NewReader(archives[0]))
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", blobs["index.json"], err)
	}
	m := index.Manifests[0]
	if m.Digest != digests[0] || m.Annotations["io.containerd.image.name"] != "ghcr.io/eztunnel/eztunnel:test" {
		t.Errorf("index entry %+v", m)
	}
	blob := func(d string) []byte {
		b, ok := blobs["blobs/sha256/"+strings.TrimPrefix(d, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", d)
		}
		return b
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest, MediaType string }
	}
	if err := json.Unmarshal(blob(m.Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v, %d layers", err, len(manifest.Layers))
	}
	var config struct {
		Architecture, OS string
		Config           struct {
			Entrypoint, Cmd []string
			User            string
		}
	}
	if err := json.Unmarshal(blob(manifest.Config.Digest), &config); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(config.Config.Entrypoint, []string{"/eztunnel"}) || config.Config.Cmd != nil ||
		config.Config.User != "0" || config.OS != "linux" || config.Architecture != runtime.GOARCH {
		t.Errorf("image config %+v", config)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(manifest.Layers[0].Digest)))
	if err != nil {
		t.Fatal(err)
	}
	layer, hdrs := files(t, zr)
	if len(layer) != 1 || hdrs["eztunnel"] == nil {
		names := []string{}
		for n := range layer {
			names = append(names, n)
		}
		t.Fatalf("layer holds %v, want only eztunnel", names)
	}
	if h := hdrs["eztunnel"]; h.Mode != 0o755 || h.Uid != 0 || h.Gid != 0 {
		t.Errorf("eztunnel entry mode %o uid %d gid %d", h.Mode, h.Uid, h.Gid)
	}
	want, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(layer["eztunnel"], want) {
		t.Fatal("the image's /eztunnel differs from the built agent")
	}
	// Static: no program interpreter (the image has no libc or loader).
	ef, err := elf.NewFile(bytes.NewReader(want))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the agent binary is dynamically linked: the image has no loader")
		}
	}
}
