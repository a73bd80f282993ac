package k8scluster

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// ImageFile is one file of an image's single layer.
type ImageFile struct {
	Src  string // host file to copy
	Mode int64
}

// Image describes a minimal single-layer linux/amd64 image.
type Image struct {
	Ref        string               // registry.local/eztunnel/x:tag
	Files      map[string]ImageFile // path in the image -> source
	Entrypoint []string
}

// WriteOCIArchive writes img as an OCI image-layout tarball importable with
// `ctr images import`, byte-for-byte reproducible from the same inputs
// (sorted entries, zero times, root owner). (A stand-in until tools/ezimage
// builds the lab images too.)
func WriteOCIArchive(dst string, img Image) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	files := map[string]ImageFile{}
	names := make([]string, 0, len(img.Files))
	for n, f := range img.Files {
		n = strings.TrimPrefix(path.Clean("/"+n), "/")
		files[n] = f
		names = append(names, n)
	}
	sort.Strings(names)
	dirs := map[string]bool{}
	epoch := time.Unix(0, 0)
	for _, n := range names {
		for d := path.Dir(n); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	dl := make([]string, 0, len(dirs))
	for d := range dirs {
		dl = append(dl, d)
	}
	sort.Strings(dl)
	for _, d := range dl {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, n := range names {
		f := files[n]
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return fmt.Errorf("k8scluster: image %s: %w", img.Ref, err)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	blobs := map[string][]byte{}
	put := func(b []byte) (string, int) {
		s := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(s[:])
		blobs[d] = b
		return d, len(b)
	}
	layerDigest, layerSize := put(layer.Bytes())
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": img.Entrypoint, "Env": []string{"PATH=/"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	cfgDigest, cfgSize := put(cfg)
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cfgDigest, "size": cfgSize},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layerSize}},
	})
	manDigest, manSize := put(man)
	tag := img.Ref[strings.LastIndex(img.Ref, ":")+1:]
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manDigest, "size": manSize,
			"platform":    map[string]string{"architecture": "amd64", "os": "linux"},
			"annotations": map[string]string{"io.containerd.image.name": img.Ref, "org.opencontainers.image.ref.name": tag},
		}},
	})
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	ow := tar.NewWriter(out)
	add := func(name string, b []byte) error {
		if err := ow.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := ow.Write(b)
		return err
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add("index.json", index); err != nil {
		return err
	}
	ds := make([]string, 0, len(blobs))
	for d := range blobs {
		ds = append(ds, d)
	}
	sort.Strings(ds)
	for _, d := range ds {
		if err := add("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), blobs[d]); err != nil {
			return err
		}
	}
	if err := ow.Close(); err != nil {
		return err
	}
	return out.Close()
}
