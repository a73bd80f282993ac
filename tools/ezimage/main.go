// Command ezimage writes a reproducible container image from files on the
// build host, without a container engine: one layer holding the given files
// (owner 0:0, fixed time stamps, sorted entries), a config with the given
// entrypoint, environment and labels, in one tar that is both an OCI image
// layout and a docker save archive.
//
//	ezimage --out bin/eztunnel-image.tar --name ghcr.io/eztunnel/eztunnel:v0.1 \
//	  --file bin/eztunnel:/eztunnel:0755 --entrypoint /eztunnel
//
// Several platforms: repeat --platform (or give a comma-separated list) and
// name each platform's file with placeholders in SRC, which are replaced per
// platform: {os}, {arch} and {variant} (empty without a variant). A --file
// without placeholders goes into every platform's image as is.
//
//	ezimage --out bin/eztunnel-image.tar --name ghcr.io/eztunnel/eztunnel:v0.1 \
//	  --platform linux/amd64 --platform linux/arm64 \
//	  --file 'bin/{os}-{arch}/eztunnel:/eztunnel:0755' --entrypoint /eztunnel
//
// One platform (the default: linux/amd64) gives one image: the OCI layout's
// index.json names its manifest, the digest is the manifest's. Several give
// one image per platform, in the order given, and an OCI image index listing
// their manifests with their platforms: index.json names that index, the
// digest is the index's, and a registry serves each node the image of its
// platform by that one digest. The docker save side
// (manifest.json) cannot hold an index: it lists the first platform's image
// only, under the name (docker load, crane push of the tar load that image).
// Any other "{" in SRC is an error, as are a platform given twice and a
// platform's missing file.
//
// Time stamps are $SOURCE_DATE_EPOCH (seconds) or the Unix epoch. The same
// inputs (the platforms' order included) give the same bytes, so the same
// digest. It prints one line, OUT NAME DIGEST (SIZE bytes), then for several
// platforms one indented line per platform: PLATFORM MANIFEST-DIGEST.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ezimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("ezimage", flag.ContinueOnError)
	out := fs.String("out", "", "the image archive to write (required)")
	ref := fs.String("name", "", "image reference with a tag, e.g. ghcr.io/eztunnel/eztunnel:v0.1 (required)")
	var files, dirs, entry, cmd, env, labels, platforms list
	fs.Var(&files, "file", "SRC:DST[:MODE] a host file at DST in the image, MODE octal (default: the source's); repeatable.\n"+
		"{os}, {arch} and {variant} in SRC are replaced per platform (e.g. bin/{os}-{arch}/agent)")
	fs.Var(&dirs, "dir", "DST[:MODE] an empty directory in the image; repeatable")
	fs.Var(&entry, "entrypoint", "one entrypoint argument; repeat for more")
	fs.Var(&cmd, "cmd", "one default argument after the entrypoint; repeat for more")
	fs.Var(&env, "env", "K=V in the image's environment; repeatable")
	fs.Var(&labels, "label", "K=V image label; repeatable")
	user := fs.String("user", "0", "user (and group) the image runs as")
	workdir := fs.String("workdir", "/", "working directory")
	fs.Var(&platforms, "platform", "os/arch[/variant] (default linux/amd64); repeat, or separate with commas, for an image\n"+
		"per platform under one OCI image index (docker save side: the first platform's image only)")
	uncompressed := fs.Bool("uncompressed", false, "store the layer as a plain tar (digest independent of the gzip implementation)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: ezimage --out FILE --name REPOSITORY[:TAG] --file SRC:DST[:MODE]... [flags]

One layer with the files, reproducible (time stamps: $SOURCE_DATE_EPOCH), in
a tar that is an OCI image layout and a docker save archive. Several
--platform: an image per platform, SRC's {os}, {arch} and {variant} replaced
by each one's, under an OCI image index (the printed digest is the index's);
the docker save side holds the first platform's image only.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *out == "" || *ref == "" {
		return fmt.Errorf("--out and --name are required")
	}
	spec := Spec{Name: *ref, Entrypoint: entry, Cmd: cmd, User: *user, WorkDir: *workdir, Uncompressed: *uncompressed}
	var plats []string
	for _, p := range platforms {
		plats = append(plats, strings.Split(p, ",")...)
	}
	if len(plats) == 0 {
		plats = []string{"linux/amd64"}
	}
	created, err := sourceDate()
	if err != nil {
		return err
	}
	spec.Created = created
	for _, f := range files {
		p, err := parseFile(f)
		if err != nil {
			return err
		}
		spec.Files = append(spec.Files, p)
	}
	for _, d := range dirs {
		p, err := parseFile("-:" + d)
		if err != nil {
			return fmt.Errorf("--dir %q: want DST[:MODE] with DST absolute", d)
		}
		spec.Dirs = append(spec.Dirs, p)
	}
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("--env %q: want K=V", e)
		}
	}
	spec.Env = env
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q: want K=V", l)
		}
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[k] = v
	}
	if len(spec.Files) == 0 {
		return fmt.Errorf("no --file given: the image would be empty")
	}
	if len(plats) > 1 && !spec.PerPlatform() {
		fmt.Fprintf(os.Stderr, "ezimage: warning: no --file SRC has a placeholder ({os}, {arch}, {variant}): the %d platforms' images hold the same files\n", len(plats))
	}
	b, err := BuildAll(spec, plats)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, *ref, b, created); err != nil {
		return err
	}
	digest, err := b.Digest()
	if err != nil {
		return err
	}
	// Write beside and rename: a failed run leaves no partial archive.
	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return err
	}
	fmt.Printf("%s %s %s (%d bytes)\n", *out, *ref, digest, buf.Len())
	if b.Index != nil {
		for i, img := range b.Images {
			d, err := img.Digest()
			if err != nil {
				return err
			}
			fmt.Printf("  %s %s\n", b.Platforms[i], d)
		}
	}
	return nil
}

// sourceDate is $SOURCE_DATE_EPOCH or the Unix epoch.
func sourceDate() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since the epoch", s)
	}
	return time.Unix(n, 0).UTC(), nil
}
