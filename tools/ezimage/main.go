// Command ezimage writes a reproducible container image from files on the
// build host, without a container engine: one layer holding the given files
// (owner 0:0, fixed time stamps, sorted entries), a config with the given
// entrypoint, environment and labels, in one tar that is both an OCI image
// layout and a docker save archive.
//
//	ezimage --out bin/eztunnel-image.tar --name ghcr.io/eztunnel/eztunnel:v0.1 \
//	  --file bin/eztunnel:/eztunnel:0755 --entrypoint /eztunnel
//
// Time stamps are $SOURCE_DATE_EPOCH (seconds) or the Unix epoch. The same
// inputs give the same bytes, so the same digest; the digest is printed.
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
	var files, dirs, entry, cmd, env, labels list
	fs.Var(&files, "file", "SRC:DST[:MODE] a host file at DST in the image, MODE octal (default: the source's); repeatable")
	fs.Var(&dirs, "dir", "DST[:MODE] an empty directory in the image; repeatable")
	fs.Var(&entry, "entrypoint", "one entrypoint argument; repeat for more")
	fs.Var(&cmd, "cmd", "one default argument after the entrypoint; repeat for more")
	fs.Var(&env, "env", "K=V in the image's environment; repeatable")
	fs.Var(&labels, "label", "K=V image label; repeatable")
	user := fs.String("user", "0", "user (and group) the image runs as")
	workdir := fs.String("workdir", "/", "working directory")
	platform := fs.String("platform", "linux/amd64", "os/arch[/variant]")
	uncompressed := fs.Bool("uncompressed", false, "store the layer as a plain tar (digest independent of the gzip implementation)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *out == "" || *ref == "" {
		return fmt.Errorf("--out and --name are required")
	}
	spec := Spec{Name: *ref, Entrypoint: entry, Cmd: cmd, User: *user, WorkDir: *workdir, Platform: *platform, Uncompressed: *uncompressed}
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
	img, err := Build(spec)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, *ref, img, created); err != nil {
		return err
	}
	digest, err := img.Digest()
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
