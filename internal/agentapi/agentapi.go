// Package agentapi is the running agent's local API: HTTP with JSON on a
// unix socket in the run directory (nodelayout.Layout.Socket), mode 0600, so
// only root on the node (or in the agent's pod) asks. `eztunnel status` and
// `eztunnel connections` ask it first: the agent knows what a command run
// beside it cannot (the selected pods and their names, the API watch), and
// lists connections with its own capabilities. Without an agent they read
// the pinned datapath themselves.
package agentapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/kube"
)

// The API's routes.
const (
	StatusPath      = "/v1/status"
	ConnectionsPath = "/v1/connections"
)

// ErrNoAgent: no agent answers at the socket (none runs, or an older one
// without the API).
var ErrNoAgent = errors.New("no agent answers")

// Status is what the agent alone knows about itself.
type Status struct {
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	// Kubernetes: nil in plain mode.
	Kubernetes *KubeStatus `json:"kubernetes,omitempty"`
}

// KubeStatus is the agent's view of its node's pods.
type KubeStatus struct {
	Node string `json:"node"`
	// Watch is the pod watch's state; Selected the pods the shortcut and
	// the bypass act for, as last applied.
	Watch    kube.Health `json:"watch"`
	Selected []Pod       `json:"selected"`
}

// Pod is a selected pod.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	CgroupID  uint64 `json:"cgroup_id"`
}

// Handlers answer the routes.
type Handlers struct {
	Status func() Status
	// Connections hands each end to emit as it lists them and returns the
	// listing's other fields (no Conns); it stops at emit's first error,
	// which it returns (ctx ends when the asker goes away).
	Connections func(ctx context.Context, emit func(datapath.Connection) error) (datapath.Listing, error)
}

// IdleTimeout is how long an asker waits for the agent's next byte: a
// listing of millions of ends takes as long as it takes while it streams,
// and fails when the agent stops sending.
var IdleTimeout = 30 * time.Second

// maxPath is what sun_path holds with its terminating NUL.
const maxPath = len(syscall.RawSockaddrUnix{}.Path) - 1

// Check refuses a socket path the kernel cannot bind.
func Check(path string) error {
	if len(path) > maxPath {
		return fmt.Errorf("the agent's socket %s is %d bytes, over the %d a unix socket address holds: choose a shorter --run-dir", path, len(path), maxPath)
	}
	return nil
}

// Listen binds path, replacing what an earlier agent of this datapath left
// (the caller holds the datapath's lock: no other agent serves it).
func Listen(path string) (net.Listener, error) {
	if err := Check(path); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("the agent's socket: %w", err)
	}
	// Connecting needs write permission on the socket: with the usual umask
	// (022) only root could until the chmod (no Umask: it is the process's,
	// and other goroutines create files).
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("the agent's socket: %w", err)
	}
	// Removed by Serve's stop only while it is still ours: the next agent
	// (a takeover) binds its own at the same path.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err := os.Stat(path)
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		ln.Close()
		os.Remove(path)
		return nil, fmt.Errorf("the agent's socket: %w", err)
	}
	return &listener{Listener: ln, path: path, fi: fi}, nil
}

// listener is a bound socket and the file it made.
type listener struct {
	net.Listener
	path string
	fi   os.FileInfo
}

// Close closes the socket and removes its file if no other agent has
// bound the path since.
func (l *listener) Close() error {
	err := l.Listener.Close()
	if fi, serr := os.Stat(l.path); serr == nil && os.SameFile(fi, l.fi) {
		os.Remove(l.path)
	}
	return err
}

// Serve answers on ln (from Listen) until stop, which closes ln and
// removes the socket.
func Serve(ln net.Listener, h Handlers) (stop func()) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+StatusPath, func(w http.ResponseWriter, _ *http.Request) { reply(w, h.Status(), nil) })
	mux.HandleFunc("GET "+ConnectionsPath, func(w http.ResponseWriter, r *http.Request) { streamConnections(w, r, h.Connections) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Warn("the agent's local API stopped", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx) // closes ln
		<-done
	}
}

// errorReply is the body of a failed request.
type errorReply struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		v = errorReply{Error: err.Error()}
	}
	json.NewEncoder(w).Encode(v)
}

// Get asks the agent at the socket path for route and decodes the answer
// into out; ErrNoAgent when nothing listens there.
func Get(ctx context.Context, path, route string, out any) error {
	resp, err := ask(ctx, path, route)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("the agent at %s: decode %s: %w", path, route, idleErr(err))
	}
	return nil
}

// ask sends GET route to the agent at the socket path and returns its 200
// answer; the connection fails when no byte comes for IdleTimeout.
func ask(ctx context.Context, path, route string) (*http.Response, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w at %s", ErrNoAgent, path)
	}
	idle := IdleTimeout
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, err
		}
		return idleConn{Conn: conn, idle: idle}, nil
	}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent"+route, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return nil, fmt.Errorf("%w at %s", ErrNoAgent, path)
	}
	if err != nil {
		return nil, fmt.Errorf("ask the agent at %s: %w", path, idleErr(err))
	}
	if resp.StatusCode == http.StatusNotFound {
		resp.Body.Close()
		return nil, fmt.Errorf("%w at %s: it does not serve %s (an older agent)", ErrNoAgent, path, route)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		var e errorReply
		json.NewDecoder(resp.Body).Decode(&e)
		return nil, fmt.Errorf("the agent at %s: %s: %s", path, resp.Status, e.Error)
	}
	return resp, nil
}

// idleConn fails a read or a write that waits more than idle.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c idleConn) Read(b []byte) (int, error) {
	c.SetReadDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(b)
}

func (c idleConn) Write(b []byte) (int, error) {
	c.SetWriteDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(b)
}

// idleErr says what an idle deadline's error means.
func idleErr(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("the agent sent nothing for %s: %w", IdleTimeout, err)
	}
	return err
}
