package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// TestBugreport: the archive holds the version, preflight and status (or
// why not), the pinned objects and kernel settings, each readable; with
// nothing pinned and no agent the missing sections are named in errors.txt.
func TestBugreport(t *testing.T) {
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = filepath.Join("/sys/fs/bpf", "eztest-bugreport-none") // never created
	var buf bytes.Buffer
	t.Setenv("POD_NAME", "") // not in a pod: the Kubernetes view says so
	names, err := writeBugreport(&buf, cfg, filepath.Join(t.TempDir(), "agent.lock"), "")
	if err != nil {
		t.Fatal(err)
	}
	got := readArchive(t, &buf)
	if len(got) != len(names) {
		t.Errorf("archive holds %d files, reported %v", len(got), names)
	}
	var v versionReport
	if err := json.Unmarshal(got["version.json"], &v); err != nil || v.Schema != datapath.Schema {
		t.Errorf("version.json: %v %+v", err, v)
	}
	var p preflightReport
	if err := json.Unmarshal(got["preflight.json"], &p); err != nil || p.Kernel == "" || len(p.Parts) == 0 {
		t.Errorf("preflight.json: %v %+v", err, p)
	}
	if !strings.Contains(string(got["pins.txt"]), "nothing pinned in") {
		t.Errorf("pins.txt: %q", got["pins.txt"])
	}
	if !strings.Contains(string(got["kernel.txt"]), "/proc/version: Linux") {
		t.Errorf("kernel.txt: %q", got["kernel.txt"])
	}
	if !strings.Contains(string(got["errors.txt"]), "agent.log") {
		t.Errorf("errors.txt does not say the agent's log is missing: %q", got["errors.txt"])
	}
	if !strings.Contains(string(got["errors.txt"]), "kubernetes/pod.json: "+errNotInPod.Error()) {
		t.Errorf("errors.txt does not say why there is no Kubernetes view: %q", got["errors.txt"])
	}
}

// TestBugreportStdout: -f - streams the archive to standard output (a pod's
// read-only root) and names its files on standard error.
func TestBugreportStdout(t *testing.T) {
	cmd := bugreportCmd()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs([]string{"-f", "-", "--pin-path", filepath.Join("/sys/fs/bpf", "eztest-bugreport-none"), "--lock-file", filepath.Join(t.TempDir(), "agent.lock")})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	names := readArchive(t, &out)
	if names["version.json"] == nil || !strings.Contains(errb.String(), "version.json") {
		t.Errorf("archive %v, stderr %q", names, errb.String())
	}
}

// readArchive reads a bugreport archive: its files by name, without the
// eztunnel-bugreport/ prefix.
func readArchive(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	gz, err := gzip.NewReader(r)
	if err != nil {
		t.Fatalf("not a gzip archive: %v", err)
	}
	tr := tar.NewReader(gz)
	got := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		} else if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[strings.TrimPrefix(h.Name, "eztunnel-bugreport/")] = b
	}
}
