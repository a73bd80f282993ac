package main

import (
	"bytes"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/agentlock"
)

// TestReady: the readiness probe answers for this pod's agent only.
func TestReady(t *testing.T) {
	t.Setenv("POD_NAME", "eztunnel-new")
	t.Setenv("POD_NAMESPACE", "eztunnel-system")
	lockFile := filepath.Join(t.TempDir(), "agent.lock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var ready atomic.Bool
	ready.Store(true)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || !ready.Load() {
			http.Error(w, "not ready: starting", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	probe := func() error {
		cmd := readyCmd()
		cmd.SetArgs([]string{"--lock-file", lockFile, "--health-addr", "0.0.0.0:" + port})
		cmd.SetOut(new(bytes.Buffer))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.Execute()
	}

	if err := probe(); err == nil || !strings.Contains(err.Error(), "no agent holds the lock") {
		t.Errorf("no agent: %v", err)
	}
	// The old pod's agent holds the node: its port answers ready, but
	// this pod is not.
	old, err := agentlock.Acquire(lockFile, "pod eztunnel-system/eztunnel-old", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := probe(); err == nil || !strings.Contains(err.Error(), "eztunnel-old") {
		t.Errorf("old agent holds the lock: %v, want not ready naming it", err)
	}
	old.Release()
	mine, err := agentlock.Acquire(lockFile, agentlock.Owner(), false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Release()
	if err := probe(); err != nil {
		t.Errorf("this pod holds the lock and is ready: %v", err)
	}
	ready.Store(false)
	if err := probe(); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("this pod's agent not ready: %v", err)
	}
	cmd := readyCmd()
	cmd.SetArgs([]string{"--lock-file", lockFile})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--health-addr") {
		t.Errorf("no --health-addr: %v", err)
	}
}

// TestReadyHealthz: --healthz is the liveness probe: /healthz on loopback,
// whoever holds the lock.
func TestReadyHealthz(t *testing.T) {
	lockFile := filepath.Join(t.TempDir(), "agent.lock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var live atomic.Bool
	live.Store(true)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || !live.Load() {
			http.Error(w, "run loop stalled for 12s", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	probe := func() error {
		cmd := readyCmd()
		cmd.SetArgs([]string{"--healthz", "--lock-file", lockFile, "--health-addr", ln.Addr().String()})
		cmd.SetOut(new(bytes.Buffer))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.Execute()
	}
	// No lock held by anyone: liveness does not ask it.
	if err := probe(); err != nil {
		t.Errorf("live agent: %v", err)
	}
	live.Store(false)
	if err := probe(); err == nil || !strings.Contains(err.Error(), "not live") || !strings.Contains(err.Error(), "stalled") {
		t.Errorf("stalled agent: %v", err)
	}
}
