package agentapi

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		Connections: func(_ context.Context, emit func(datapath.Connection) error) (datapath.Listing, error) {
			if fail {
				return datapath.Listing{}, errors.New("iterator refused")
			}
			for _, c := range want.Conns {
				if err := emit(c); err != nil {
					return datapath.Listing{}, err
				}
			}
			return datapath.Listing{Via: want.Via}, nil
		},
	})
	var st Status
	if err := Get(context.Background(), path, StatusPath, &st); err != nil || st.PID != 42 || st.Kubernetes == nil || st.Kubernetes.Selected[0].Name != "a" {
		t.Fatalf("status %+v, %v", st, err)
	}
	// The stream, as this build reads it and as an older asker decodes it
	// (one Listing).
	var got datapath.Listing
	if err := Get(context.Background(), path, ConnectionsPath, &got); err != nil || len(got.Conns) != 1 || got.Conns[0] != want.Conns[0] || got.Via != "test" {
		t.Fatalf("connections %+v, %v", got, err)
	}
	var ends []datapath.Connection
	l, err := Connections(context.Background(), path, func(c datapath.Connection) error { ends = append(ends, c); return nil })
	if err != nil || len(ends) != 1 || ends[0] != want.Conns[0] || l.Via != "test" {
		t.Fatalf("streamed connections %+v %+v, %v", ends, l, err)
	}
	fail = true
	if _, err := Connections(context.Background(), path, func(datapath.Connection) error { return nil }); err == nil || !strings.Contains(err.Error(), "iterator refused") {
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

// serveListing serves a listing made by list on a fresh socket.
func serveListing(t *testing.T, list func(context.Context, func(datapath.Connection) error) (datapath.Listing, error)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(Serve(ln, Handlers{Status: func() Status { return Status{} }, Connections: list}))
	return path
}

func end(i int) datapath.Connection {
	return datapath.Connection{Cookie: uint64(i), Role: "client", Client: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.1"), uint16(i)),
		Server: netip.MustParseAddrPort("10.0.0.2:80")}
}

// TestListingPartWay: a listing that fails after some ends were sent
// reaches the asker as an error, after those ends; an empty listing is
// no error.
func TestListingPartWay(t *testing.T) {
	fail := true
	path := serveListing(t, func(_ context.Context, emit func(datapath.Connection) error) (datapath.Listing, error) {
		if !fail {
			return datapath.Listing{Via: "empty"}, nil
		}
		for i := range 3 {
			if err := emit(end(i)); err != nil {
				return datapath.Listing{}, err
			}
		}
		return datapath.Listing{Via: "test"}, errors.New("read connection record: unexpected EOF")
	})
	n := 0
	l, err := Connections(context.Background(), path, func(datapath.Connection) error { n++; return nil })
	if err == nil || !strings.Contains(err.Error(), "part-way: read connection record") || n != 3 || l.Via != "test" {
		t.Fatalf("%d ends, %+v, %v; want 3 ends and the error", n, l, err)
	}
	fail = false
	if l, err := Connections(context.Background(), path, func(datapath.Connection) error { n++; return nil }); err != nil || l.Via != "empty" || n != 3 {
		t.Fatalf("an empty listing: %+v, %v (%d ends)", l, err, n)
	}
}

// TestListingAbandoned: an asker that goes away part-way through a
// listing (its command killed, its context ended) stops the agent's walk:
// the handler's next emit fails instead of the agent walking on and
// building an answer nobody reads.
func TestListingAbandoned(t *testing.T) {
	stopped := make(chan error, 1)
	path := serveListing(t, func(ctx context.Context, emit func(datapath.Connection) error) (datapath.Listing, error) {
		for i := 0; ; i++ {
			if err := emit(end(i)); err != nil {
				stopped <- err
				return datapath.Listing{}, err
			}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	_, err := Connections(ctx, path, func(datapath.Connection) error {
		if n++; n == 10000 {
			cancel()
		}
		return nil
	})
	if err == nil {
		t.Fatal("the abandoned listing returned no error")
	}
	if err := <-stopped; !strings.Contains(err.Error(), "the asker went away") {
		t.Fatalf("the agent's walk stopped with %v, want the asker gone", err)
	}
}

// TestListingIdle: an agent that stops sending part-way fails the asker
// after IdleTimeout without a byte, whatever the listing's length.
func TestListingIdle(t *testing.T) {
	defer func(d time.Duration) { IdleTimeout = d }(IdleTimeout)
	IdleTimeout = 200 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	path := serveListing(t, func(ctx context.Context, emit func(datapath.Connection) error) (datapath.Listing, error) {
		emit(end(1))
		select {
		case <-release:
		case <-ctx.Done():
		}
		return datapath.Listing{}, nil
	})
	_, err := Connections(context.Background(), path, func(datapath.Connection) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "sent nothing for") {
		t.Fatalf("a stalled agent: %v, want the idle deadline", err)
	}
}
