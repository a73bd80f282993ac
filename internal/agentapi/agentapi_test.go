package agentapi

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// TestRoundTrip: what the agent's handlers return is what Get decodes; a
// handler's error reaches the caller; the socket is root's only and gone
// after stop; without a listener Get says ErrNoAgent.
func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	if err := Get(context.Background(), path, StatusPath, &Status{}); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("no socket: %v, want ErrNoAgent", err)
	}
	os.WriteFile(path, nil, 0o600) // a leftover file: replaced
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	want := datapath.Listing{Via: "test", Conns: []datapath.Connection{{Cookie: 7, Role: "client",
		Client: netip.MustParseAddrPort("10.0.0.1:4000"), Server: netip.MustParseAddrPort("10.0.0.2:80"), Pod: "ns/a", CgroupID: 9}}}
	fail := false
	stop := Serve(ln, Handlers{
		Status: func() Status {
			return Status{PID: 42, Version: "v", Kubernetes: &KubeStatus{Node: "n", Selected: []Pod{{Namespace: "ns", Name: "a", CgroupID: 9}}}}
		},
		Connections: func() (datapath.Listing, error) {
			if fail {
				return datapath.Listing{}, errors.New("iterator refused")
			}
			return want, nil
		},
	})
	var st Status
	if err := Get(context.Background(), path, StatusPath, &st); err != nil || st.PID != 42 || st.Kubernetes == nil || st.Kubernetes.Selected[0].Name != "a" {
		t.Fatalf("status %+v, %v", st, err)
	}
	var got datapath.Listing
	if err := Get(context.Background(), path, ConnectionsPath, &got); err != nil || len(got.Conns) != 1 || got.Conns[0] != want.Conns[0] || got.Via != "test" {
		t.Fatalf("connections %+v, %v", got, err)
	}
	fail = true
	if err := Get(context.Background(), path, ConnectionsPath, &got); err == nil || !strings.Contains(err.Error(), "iterator refused") {
		t.Fatalf("a handler's error: %v", err)
	}
	if err := Get(context.Background(), path, "/v1/nothing", &got); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("unknown route: %v, want ErrNoAgent (an older agent)", err)
	}
	stop()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after stop: %v", err)
	}
}

// TestTakeover: an agent stopping after the next one bound the path
// leaves the next one's socket in place.
func TestTakeover(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	old, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	stopOld := Serve(old, Handlers{Status: func() Status { return Status{PID: 1} }})
	next, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	stopNext := Serve(next, Handlers{Status: func() Status { return Status{PID: 2} }})
	defer stopNext()
	stopOld()
	var st Status
	if err := Get(context.Background(), path, StatusPath, &st); err != nil || st.PID != 2 {
		t.Fatalf("after the old agent stopped: %+v, %v; want the next agent (pid 2)", st, err)
	}
}

func TestCheck(t *testing.T) {
	if err := Check("/run/eztunnel/" + strings.Repeat("x", 100)); err == nil || !strings.Contains(err.Error(), "--run-dir") {
		t.Fatalf("a long path: %v", err)
	}
	if err := Check("/run/eztunnel/sys_fs_bpf_eztunnel_v2.sock"); err != nil {
		t.Fatal(err)
	}
}
