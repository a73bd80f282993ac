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
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of the image: Src on the build host, Dst in the image.
// Src may hold the placeholders {os}, {arch} and {variant}, replaced by each
// platform's (see expand).
type File struct {
	Src, Dst string
	Mode     int64 // permission bits; -1: the source file's
	// pattern is Src before expand replaced its placeholders (errors name
	// both).
	pattern string
}

// placeholders are what a --file SRC may name, replaced per platform.
var placeholders = []string{"{os}", "{arch}", "{variant}"}

// checkPlaceholders fails on a "{" in src that does not start one of the
// placeholders: a misspelt one would otherwise be taken as a file name.
func checkPlaceholders(src string) error {
	for i := 0; i < len(src); i++ {
		if src[i] != '{' {
			continue
		}
		known := false
		for _, p := range placeholders {
			if strings.HasPrefix(src[i:], p) {
				known, i = true, i+len(p)-1
				break
			}
		}
		if !known {
			bad := src[i:]
			if end := strings.IndexByte(bad, '}'); end >= 0 {
				bad = bad[:end+1]
			}
			return fmt.Errorf("unknown placeholder %q in %q: want {os}, {arch} or {variant}", bad, src)
		}
	}
	return nil
}

// expand replaces the placeholders of f.Src with the platform's os, arch
// and variant (empty without one).
func (f File) expand(p v1.Platform) File {
	r := strings.NewReplacer("{os}", p.OS, "{arch}", p.Architecture, "{variant}", p.Variant)
	f.pattern, f.Src = f.Src, r.Replace(f.Src)
	return f
}

// name is the file's source for errors: the path, and the pattern it came
// from when that had placeholders.
func (f File) name() string {
	if f.pattern != "" && f.pattern != f.Src {
		return f.Src + " (from " + f.pattern + ")"
	}
	return f.Src
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
	Platform   string // os/arch[/variant]: Build's; BuildAll takes a list
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
	if err := checkPlaceholders(f.Src); err != nil {
		return File{}, fmt.Errorf("--file %q: %w", s, err)
	}
	for _, p := range placeholders {
		if strings.Contains(f.Dst, p) {
			return File{}, fmt.Errorf("--file %q: placeholder %s in DST: every platform's image has the same paths, only SRC varies", s, p)
		}
	}
	return f, nil
}

// PerPlatform reports whether a file's source names a placeholder, i.e.
// whether the platforms' images can differ.
func (s Spec) PerPlatform() bool {
	for _, f := range s.Files {
		for _, p := range placeholders {
			if strings.Contains(f.Src, p) {
				return true
			}
		}
	}
	return false
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
			return nil, fmt.Errorf("--file %s: %w", f.name(), err)
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("--file %s: not a regular file", f.name())
		}
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("--file %s: %w", f.name(), err)
		}
		p := strings.TrimPrefix(path.Clean(f.Dst), "/")
		if p == "" {
			return nil, fmt.Errorf("--file %s: destination %q is the root", f.name(), f.Dst)
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("--file %s: %s is already in the image", f.name(), f.Dst)
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

// parsePlatform parses os/arch[/variant].
func parsePlatform(s string) (*v1.Platform, error) {
	plat, err := v1.ParsePlatform(s)
	if err != nil || plat.OS == "" || plat.Architecture == "" {
		return nil, fmt.Errorf("--platform %q: want os/arch[/variant], e.g. linux/amd64", s)
	}
	return plat, nil
}

// Build assembles the image of spec.Platform, the placeholders of the files'
// sources replaced by that platform's.
func Build(spec Spec) (v1.Image, error) {
	plat, err := parsePlatform(spec.Platform)
	if err != nil {
		return nil, err
	}
	files := make([]File, len(spec.Files))
	for i, f := range spec.Files {
		files[i] = f.expand(*plat)
	}
	spec.Files = files
	tb, err := layerTar(spec)
	if err != nil {
		return nil, err
	}
	var layer v1.Layer
	if spec.Uncompressed {
		layer = static.NewLayer(tb, types.OCIUncompressedLayer)
	} else {
		layer, err = tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tb)), nil },
			tarball.WithCompressionLevel(gzip.BestCompression), tarball.WithMediaType(types.OCILayer),
			tarball.WithCompressedCaching) // compressed once, not for the digest and again for the blob
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

// Built is what BuildAll makes: an image per platform, in the order given,
// and for more than one platform the OCI image index listing their manifests
// with their platforms.
type Built struct {
	Platforms []string // as parsed (v1.Platform.String)
	Images    []v1.Image
	Index     v1.ImageIndex // nil for one platform: the image stands alone
}

// Top is the archive's one entry, the index or else the only image.
func (b *Built) Top() partial.Describable {
	if b.Index != nil {
		return b.Index
	}
	return b.Images[0]
}

// Digest is the top entry's: the digest to pull by.
func (b *Built) Digest() (v1.Hash, error) { return b.Top().Digest() }

// BuildAll builds spec's image for each platform (spec.Platform unused).
// One platform gives the image alone, exactly as Build; several give their
// images under an OCI image index. A platform listed twice is an error:
// a client picks one manifest per platform.
func BuildAll(spec Spec, platforms []string) (*Built, error) {
	if len(platforms) == 0 {
		return nil, fmt.Errorf("no --platform")
	}
	b := &Built{}
	seen := map[string]string{}
	plats := make([]*v1.Platform, len(platforms))
	for i, s := range platforms {
		p, err := parsePlatform(s)
		if err != nil {
			return nil, err
		}
		// arm64's only variant is v8: linux/arm64 and linux/arm64/v8 match
		// the same nodes.
		key := *p
		if key.Architecture == "arm64" && key.Variant == "v8" {
			key.Variant = ""
		}
		if prev, dup := seen[key.String()]; dup {
			if prev == p.String() {
				return nil, fmt.Errorf("--platform %s given twice", prev)
			}
			return nil, fmt.Errorf("--platform %s: the same platform as %s", p, prev)
		}
		seen[key.String()] = p.String()
		plats[i] = p
		b.Platforms = append(b.Platforms, p.String())
	}
	var adds []mutate.IndexAddendum
	for i, p := range plats {
		spec.Platform = b.Platforms[i]
		img, err := Build(spec)
		if err != nil {
			if len(plats) > 1 {
				return nil, fmt.Errorf("platform %s: %w", p, err)
			}
			return nil, err
		}
		b.Images = append(b.Images, img)
		adds = append(adds, mutate.IndexAddendum{Add: plainDescriptor{img}, Descriptor: v1.Descriptor{Platform: p}})
	}
	if len(plats) > 1 {
		b.Index = mutate.AppendManifests(empty.Index, adds...)
	}
	return b, nil
}

// plainDescriptor describes an image in the index by media type, size and
// digest (and the platform the index adds), as container builders' indexes
// do: go-containerregistry would also set artifactType to the config's
// media type, which only artifact (referrers) indexes need.
type plainDescriptor struct{ v1.Image }

func (p plainDescriptor) Descriptor() (*v1.Descriptor, error) {
	mt, err := p.MediaType()
	if err != nil {
		return nil, err
	}
	size, err := p.Size()
	if err != nil {
		return nil, err
	}
	d, err := p.Digest()
	if err != nil {
		return nil, err
	}
	return &v1.Descriptor{MediaType: mt, Size: size, Digest: d}, nil
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

// WriteArchive writes b as one tar that is both an OCI image layout
// (oci-layout, index.json, blobs/sha256/...: ctr import, skopeo
// oci-archive:) and a docker save archive (manifest.json naming the same
// blobs: docker load, crane push). index.json names b's top entry (the index,
// or the only image) under ref; manifest.json, which cannot express an
// index, lists the first platform's image under ref. Each platform's config,
// layers and manifest come in the platforms' order, then the index; a blob
// two platforms share is written once. Entries are in a fixed order with
// fixed headers.
func WriteArchive(w io.Writer, ref string, b *Built, created time.Time) error {
	full, tag, err := normalizeRef(ref)
	if err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	tw := tar.NewWriter(w)
	written := map[string]bool{}
	put := func(n string, b []byte) error {
		if written[n] { // a blob of the same digest: the same bytes
			return nil
		}
		written[n] = true
		for _, d := range []string{"blobs/", "blobs/sha256/"} {
			if strings.HasPrefix(n, d) && !written[d] {
				written[d] = true
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
	// putImage writes an image's blobs and returns the docker side's entry.
	putImage := func(img v1.Image) (tarball.Descriptor, error) {
		var d tarball.Descriptor
		manifest, err := img.RawManifest()
		if err != nil {
			return d, err
		}
		digest, err := img.Digest()
		if err != nil {
			return d, err
		}
		cfgName, err := img.ConfigName()
		if err != nil {
			return d, err
		}
		cfg, err := img.RawConfigFile()
		if err != nil {
			return d, err
		}
		layers, err := img.Layers()
		if err != nil {
			return d, err
		}
		if err := put(blob(cfgName), cfg); err != nil {
			return d, err
		}
		d.Config = blob(cfgName)
		for _, l := range layers {
			ld, err := l.Digest()
			if err != nil {
				return d, err
			}
			rc, err := l.Compressed()
			if err != nil {
				return d, err
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				return d, err
			}
			if err := put(blob(ld), b); err != nil {
				return d, err
			}
			d.Layers = append(d.Layers, blob(ld))
		}
		return d, put(blob(digest), manifest)
	}
	var first tarball.Descriptor
	for i, img := range b.Images {
		d, err := putImage(img)
		if err != nil {
			return err
		}
		if i == 0 {
			first = d
		}
	}
	top := b.Top()
	if b.Index != nil {
		raw, err := b.Index.RawManifest()
		if err != nil {
			return err
		}
		d, err := b.Index.Digest()
		if err != nil {
			return err
		}
		if err := put(blob(d), raw); err != nil {
			return err
		}
	}
	desc, err := partial.Descriptor(top)
	if err != nil {
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
			MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest, Annotations: ann,
		}},
	})
	if err != nil {
		return err
	}
	if err := put("index.json", index); err != nil {
		return err
	}
	first.RepoTags = []string{full}
	dm, err := json.Marshal([]tarball.Descriptor{first})
	if err != nil {
		return err
	}
	if err := put("manifest.json", dm); err != nil {
		return err
	}
	return tw.Close()
}
