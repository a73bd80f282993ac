package k8scluster

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// The same inputs give the same archive, byte for byte.
func TestWriteOCIArchiveReproducible(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "bin")
	if err := os.WriteFile(src, []byte("#!binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	img := Image{Ref: "registry.local/x/y:1", Entrypoint: []string{"/bin"},
		Files: map[string]ImageFile{"/bin": {Src: src}, "etc/v": {Src: src, Mode: 0o644}}}
	var outs [][]byte
	for _, name := range []string{"a.tar", "b.tar"} {
		p := filepath.Join(dir, name)
		if err := WriteOCIArchive(p, img); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, b)
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("two builds of one image differ")
	}
}
