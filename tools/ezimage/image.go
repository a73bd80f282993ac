package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of the image: Src on the build host, Dst in the image.
type File struct {
	Src, Dst string
	Mode     int64 // permission bits; -1: the source file's
}

// Spec is everything the image is built from. The same Spec (and the same
// file contents) gives the same bytes and so the same digest.
type Spec struct {
	Name       string // reference written into the archive (ctr, docker load)
	Files      []File
	Dirs       []File // empty directories (Src unused)
	Entrypoint []string
	Cmd        []string
	Env        []string
	Labels     map[string]string
	User       string
	WorkDir    string
	Platform   string // os/arch[/variant]
	Created    time.Time
	// Uncompressed stores the layer as a plain tar (static layer): its
	// digest does not depend on the gzip implementation.
	Uncompressed bool
}

// parseFile parses SRC:DST[:MODE] (MODE in octal).
func parseFile(s string) (File, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return File{}, fmt.Errorf("--file %q: want SRC:DST[:MODE]", s)
	}
	f := File{Src: parts[0], Dst: parts[1], Mode: -1}
	if len(parts) == 3 {
		m, err := strconv.ParseInt(parts[2], 8, 32)
		if err != nil || m < 0 || m > 0o7777 {
			return File{}, fmt.Errorf("--file %q: MODE %q is not an octal permission (e.g. 0755)", s, parts[2])
		}
		f.Mode = m
	}
	if !path.IsAbs(f.Dst) {
		return File{}, fmt.Errorf("--file %q: DST %q must be an absolute path in the image", s, f.Dst)
	}
	return f, nil
}

// layerTar writes the files as one tar: parent directories first, entries
// sorted by path, owner 0:0, every time stamp = created, no user or group
// names, no extended attributes: nothing of the build host but the bytes and
// modes.
func layerTar(spec Spec) ([]byte, error) {
	type entry struct {
		hdr  tar.Header
		data []byte
	}
	entries := map[string]*entry{}
	addDir := func(p string, mode int64) error {
		if e, ok := entries[p]; ok {
			if e.hdr.Typeflag != tar.TypeDir {
				return fmt.Errorf("%s is both a file and a directory", p)
			}
			return nil
		}
		entries[p] = &entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode}}
		return nil
	}
	parents := func(p string) error {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if err := addDir(strings.TrimPrefix(d, "/"), 0o755); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range spec.Dirs {
		p := strings.TrimPrefix(path.Clean(d.Dst), "/")
		if p == "" {
			return nil, fmt.Errorf("--dir %q: not a directory below /", d.Dst)
		}
		mode := d.Mode
		if mode < 0 {
			mode = 0o755
		}
		if err := parents("/" + p); err != nil {
			return nil, err
		}
		if err := addDir(p, mode); err != nil {
			return nil, err
		}
		entries[p].hdr.Mode = mode
	}
	for _, f := range spec.Files {
		st, err := os.Stat(f.Src)
		if err != nil {
			return nil, fmt.Errorf("--file %s: %w", f.Src, err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("--file %s: not a regular file", f.Src)
		}
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("--file %s: %w", f.Src, err)
		}
		p := strings.TrimPrefix(path.Clean(f.Dst), "/")
		if p == "" {
			return nil, fmt.Errorf("--file %s: destination %q is the root", f.Src, f.Dst)
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("--file %s: %s is already in the image", f.Src, f.Dst)
		}
		mode := f.Mode
		if mode < 0 {
			mode = int64(st.Mode().Perm())
		}
		if err := parents("/" + p); err != nil {
			return nil, err
		}
		entries[p] = &entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode, Size: int64(len(b))}, data: b}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		e.hdr.ModTime, e.hdr.AccessTime, e.hdr.ChangeTime = spec.Created, time.Time{}, time.Time{}
		e.hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Build assembles the image.
func Build(spec Spec) (v1.Image, error) {
	plat, err := v1.ParsePlatform(spec.Platform)
	if err != nil || plat.OS == "" || plat.Architecture == "" {
		return nil, fmt.Errorf("--platform %q: want os/arch[/variant], e.g. linux/amd64", spec.Platform)
	}
	tb, err := layerTar(spec)
	if err != nil {
		return nil, err
	}
	var layer v1.Layer
	if spec.Uncompressed {
		layer = static.NewLayer(tb, types.OCIUncompressedLayer)
	} else {
		layer, err = tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tb)), nil },
			tarball.WithCompressionLevel(gzip.BestCompression), tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, err
		}
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: spec.Created}, CreatedBy: "ezimage", Comment: "files: " + strconv.Itoa(len(spec.Files)),
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = plat.OS, plat.Architecture, plat.Variant
	cf.Created = v1.Time{Time: spec.Created}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = spec.Env
	cf.Config.User = spec.User
	cf.Config.WorkingDir = spec.WorkDir
	if len(spec.Labels) > 0 {
		cf.Config.Labels = spec.Labels
	}
	return mutate.ConfigFile(img, cf)
}

// normalizeRef returns ref as containerd names images (docker.io/library/x:tag
// for Docker Hub) and its tag; a reference without a tag gets "latest", a
// digest reference is refused (the digest is the image's own).
func normalizeRef(ref string) (full, tag string, err error) {
	r, err := name.ParseReference(ref, name.WithDefaultTag("latest"))
	if err != nil {
		return "", "", fmt.Errorf("--name %q: %w", ref, err)
	}
	t, ok := r.(name.Tag)
	if !ok {
		return "", "", fmt.Errorf("--name %q: want REPOSITORY[:TAG], not a digest", ref)
	}
	reg := t.RegistryStr()
	if reg == name.DefaultRegistry {
		reg = "docker.io"
	}
	return reg + "/" + t.RepositoryStr() + ":" + t.TagStr(), t.TagStr(), nil
}

// WriteArchive writes img as one tar that is both an OCI image layout
// (oci-layout, index.json, blobs/sha256/...: ctr import, skopeo
// oci-archive:) and a docker save archive (manifest.json naming the same
// blobs: docker load, crane push). Entries are in a fixed order with fixed
// headers.
func WriteArchive(w io.Writer, ref string, img v1.Image, created time.Time) error {
	full, tag, err := normalizeRef(ref)
	if err != nil {
		return err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	mt, err := img.MediaType()
	if err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	tw := tar.NewWriter(w)
	dirs := map[string]bool{}
	put := func(n string, b []byte) error {
		for _, d := range []string{"blobs/", "blobs/sha256/"} {
			if strings.HasPrefix(n, d) && !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: created, Format: tar.FormatPAX}); err != nil {
					return err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(b)), ModTime: created, Format: tar.FormatPAX}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := put(blob(cfgName), cfg); err != nil {
		return err
	}
	var layerPaths []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		if err := put(blob(d), b); err != nil {
			return err
		}
		layerPaths = append(layerPaths, blob(d))
	}
	if err := put(blob(digest), manifest); err != nil {
		return err
	}
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	ann := map[string]string{"io.containerd.image.name": full, "org.opencontainers.image.ref.name": tag}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType: mt, Size: int64(len(manifest)), Digest: digest, Annotations: ann,
		}},
	})
	if err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	dm, err := json.Marshal([]tarball.Descriptor{{Config: blob(cfgName), RepoTags: []string{full}, Layers: layerPaths}})
	if err != nil {
		return err
	}
	if err := put("manifest.json", dm); err != nil {
		return err
	}
	return tw.Close()
}
