package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

// TestVersion: the binary's own version, Go and schema; the running agent's
// version read from the lock it holds (an agent of another version: the
// Version it wrote), none once it lets the lock go; the JSON keys.
func TestVersion(t *testing.T) {
	dir := t.TempDir()
	lockFile := filepath.Join(dir, "agent.lock")
	pins := filepath.Join(dir, "pins")

	r, err := readVersion(datapath.Config{PinRoot: pins}, lockFile)
	if err != nil {
		t.Fatal(err)
	}
	if r.Agent != nil || r.Schema != datapath.Schema || !strings.HasPrefix(r.Go, "go") || r.Version == "" || len(r.PinnedSchemas) != 0 {
		t.Fatalf("no agent, nothing pinned: %+v", r)
	}

	old := agentlock.Version
	agentlock.Version = "v9.9.9-other"
	t.Cleanup(func() { agentlock.Version = old })
	l, err := agentlock.Acquire(lockFile, "pod kube-system/eztunnel-x", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	r, err = readVersion(datapath.Config{PinRoot: pins}, lockFile)
	if err != nil {
		t.Fatal(err)
	}
	if r.Agent == nil || r.Agent.Version != "v9.9.9-other" || r.Agent.Holder != "pod kube-system/eztunnel-x" || r.Agent.PID == 0 {
		t.Fatalf("running agent: %+v", r.Agent)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"version":`, `"go":`, `"schema":"` + datapath.Schema + `"`, `"agent":{"holder":`, `"pinned_schemas":`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("version -o json lacks %s: %s", k, b)
		}
	}

	l.Release()
	if r, err = readVersion(datapath.Config{PinRoot: pins}, lockFile); err != nil || r.Agent != nil {
		t.Fatalf("after release: %+v, %v", r.Agent, err)
	}
}
