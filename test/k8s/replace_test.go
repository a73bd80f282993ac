//go:build k8s

package k8s

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/nodelayout"
)

// TestKubernetesReplace: replacing the agent's DaemonSet under the same name
// gives it a new UID (kubectl replace --force: delete, then create; delete
// --cascade=orphan, then create). Neither uninstalls the node: the datapath
// stays pinned throughout (sampled every 50 ms), the new DaemonSet's agent
// serves the node, and no agent logs an uninstall. A helm uninstall
// afterwards still removes everything.
func TestKubernetesReplace(tt *testing.T) {
	t := summarized(tt)
	if l := leftovers(); len(l) > 0 {
		t.Fatalf("eztunnel state before the install: %v", l)
	}
	inst := newInstaller(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", agentLogs(t))
		}
		removeAgent(t)
	})
	inst.install(t, agentTag)

	// The pins, watched while the DaemonSet is replaced.
	var mu sync.Mutex
	var gaps []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if ents, err := os.ReadDir(pinPath); err != nil || len(ents) == 0 {
				mu.Lock()
				gaps = append(gaps, time.Now().Format(time.TimeOnly)+": no pins")
				mu.Unlock()
			}
		}
	}()

	// The DaemonSet as a new object: no identity, no status.
	var ds map[string]any
	if err := json.Unmarshal([]byte(kubectl(t, "-n", agentNS, "get", "daemonset", release, "-o", "json")), &ds); err != nil {
		t.Fatal(err)
	}
	meta := ds["metadata"].(map[string]any)
	for _, k := range []string{"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"} {
		delete(meta, k)
	}
	delete(ds, "status")
	raw, _ := json.Marshal(ds)
	file := filepath.Join(t.TempDir(), "ds.json")
	if err := os.WriteFile(file, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	uid := func() string {
		return strings.TrimSpace(kubectl(t, "-n", agentNS, "get", "daemonset", release, "-o", "jsonpath={.metadata.uid}"))
	}
	for _, c := range []struct {
		name string
		do   func()
	}{
		{"replace --force", func() { kubectl(t, "replace", "--force", "-f", file) }},
		{"delete --cascade=orphan, create", func() {
			kubectl(t, "-n", agentNS, "delete", "daemonset", release, "--cascade=orphan")
			kubectl(t, "create", "-f", file)
		}},
	} {
		before := uid()
		c.do()
		if after := uid(); after == before {
			t.Fatalf("%s: the DaemonSet kept its UID %s", c.name, after)
		}
		waitAgentReady(t)
		// The old agent's decision: it re-reads the DaemonSet after its
		// settle time (5 s) when it looked removed.
		time.Sleep(15 * time.Second)
		if l := leftovers(); len(l) == 0 {
			t.Errorf("%s: no eztunnel state on the node: uninstalled", c.name)
		}
		if logs := agentLogs(t); strings.Contains(logs, "draining and removing the datapath") {
			t.Errorf("%s: an agent uninstalled:\n%s", c.name, logs)
		}
	}
	close(stop)
	<-done
	if len(gaps) > 0 {
		t.Errorf("the datapath was unpinned during the replacements: %v", gaps)
	}

	// Removal still removes.
	inst.uninstall(t)
	deadline := time.Now().Add(90 * time.Second)
	for len(leftovers()) > 0 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
	}
	if l := leftovers(); len(l) > 0 {
		t.Errorf("after helm uninstall of the replaced DaemonSet: %v", l)
		// The pods are gone with their DaemonSet: the agent's own log on
		// the node (kept until an uninstall removes it) says what it did.
		if b, err := os.ReadFile(nodelayout.Layout{PinRoot: pinPath}.Log()); err == nil {
			t.Logf("the agent's log on the node (last 4 KiB):\n%s", b[max(0, len(b)-4096):])
		}
	}
}
