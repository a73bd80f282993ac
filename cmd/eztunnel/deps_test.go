package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestAgentCarriesNoLab: the agent binary (what a DaemonSet image holds)
// links nothing of the benchmark lab and no plotting library.
func TestAgentCarriesNoLab(t *testing.T) {
	out, err := sysexec.Command(context.Background(), "go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 || !strings.Contains(string(out), "github.com/eztunnel/eztunnel/internal/datapath") {
		t.Fatalf("go list -deps listed %d packages without the datapath: %q", len(deps), out)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/eztunnel/eztunnel/lab/") || strings.HasPrefix(d, "gonum.org/") {
			t.Errorf("the agent binary links %s", d)
		}
		// One Kubernetes client stack: REST clients of a trimmed scheme
		// (internal/kube), no typed clientset (its scheme registers every
		// API group: about 28 MB) nor its informer factories.
		if d == "k8s.io/client-go/kubernetes" || d == "k8s.io/client-go/informers" || d == "k8s.io/client-go/kubernetes/scheme" {
			t.Errorf("the agent binary links %s", d)
		}
		// Nor k8s.io/api's types (internal/kubeapi has what the agent
		// reads), nor the typed listers built on them.
		if strings.HasPrefix(d, "k8s.io/api/") || strings.HasPrefix(d, "k8s.io/client-go/listers") {
			t.Errorf("the agent binary links %s", d)
		}
	}
}

// maxAgentBytes bounds the stripped agent binary (built as `make build`
// does), 26 MB: under what k8s.io/api's types alone would add (4.4 MB).
// 56.5 MB (amd64) with client-go's typed clientset; 28.7 MB without it;
// 24.3 MB without k8s.io/api's types (2026-11-26); 25.0 MB with four days
// of features, the close reset's namespace coverage among them (2026-11-30).
const maxAgentBytes = 26_000_000

// TestAgentSize: the agent, built as the Makefile builds it for each
// platform of the image, stays under maxAgentBytes.
func TestAgentSize(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		out := filepath.Join(t.TempDir(), "eztunnel-"+arch)
		cmd := sysexec.Command(context.Background(), "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build (%s): %v\n%s", arch, err, b)
		}
		st, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("stripped agent, %s: %d bytes (%.1f MB)", arch, st.Size(), float64(st.Size())/1e6)
		if st.Size() > maxAgentBytes {
			t.Errorf("the stripped agent (%s) is %d bytes, over %d: what grew? (go tool nm -size -sort size)", arch, st.Size(), maxAgentBytes)
		}
	}
}
