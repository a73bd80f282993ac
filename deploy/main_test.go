// Package deploy tests what deploy/ and the image tool ship: the agent's
// container image (tools/ezimage), the Helm chart (deploy/helm/eztunnel,
// rendered with tools/helm) and its committed plain-manifest rendering.
package deploy

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/internal/toolbin"
)

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
	agentDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if agentDir != "" {
		os.RemoveAll(agentDir)
	}
	os.Exit(code)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// agent builds the static agent binary as the Makefile does, once per run.
func agent(t *testing.T) string {
	t.Helper()
	agentOnce.Do(func() {
		agentDir, agentErr = os.MkdirTemp("", "eztunnel-deploy-test-")
		if agentErr != nil {
			return
		}
		agentPath = filepath.Join(agentDir, "eztunnel")
		cmd := sysexec.Command(context.Background(), "go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=deploy-test",
			"-o", agentPath, "./cmd/eztunnel")
		cmd.Dir = repoRoot(t)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = err
			agentPath = string(out)
		}
	})
	if agentErr != nil {
		t.Fatalf("building the agent: %v\n%s", agentErr, agentPath)
	}
	return agentPath
}

// tool returns the cached binary of tools/<name>, building it if needed.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := toolbin.Build(t.Context(), repoRoot(t), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
