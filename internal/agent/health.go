package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// health serves /healthz (the run loop is turning) and /readyz (this agent
// holds the node lock and the datapath is installed and converged to what it
// was told: in Kubernetes mode, after the first sync of the pods).
type health struct {
	ln    net.Listener
	ready atomic.Bool
	beat  atomic.Int64 // unix nanoseconds of the run loop's last turn
	why   atomic.Value // string: why not ready
	// check, once set, is asked at each /readyz of a ready agent: a part
	// that cannot do its work (socket destroy: services.notReady).
	check atomic.Pointer[func() string]
}

// setCheck adds a readiness check: not ready while it returns a reason.
func (h *health) setCheck(f func() string) { h.check.Store(&f) }

// staleAfter: a loop that has not turned for this long is not alive.
const staleAfter = 10 * time.Second

func listenHealth(addr string) (*health, error) {
	h := &health{}
	h.why.Store("starting")
	h.beat.Store(time.Now().UnixNano())
	if addr == "" {
		return h, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("health address %s: %w", addr, err)
	}
	h.ln = ln
	return h, nil
}

func (h *health) setReady(ok bool, why string) {
	h.why.Store(why)
	h.ready.Store(ok)
}

func (h *health) tick() { h.beat.Store(time.Now().UnixNano()) }

// serve serves until stop is called or ctx is done; stop returns once the
// address is free again. Nothing is served when no address was given.
func (h *health) serve(ctx context.Context) (stop func()) {
	if h.ln == nil {
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if age := time.Since(time.Unix(0, h.beat.Load())); age > staleAfter {
			http.Error(w, fmt.Sprintf("run loop stalled for %s", age.Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !h.ready.Load() {
			http.Error(w, "not ready: "+h.why.Load().(string), http.StatusServiceUnavailable)
			return
		}
		if f := h.check.Load(); f != nil {
			if why := (*f)(); why != "" {
				http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
				return
			}
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		<-ctx.Done()
		sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer scancel()
		srv.Shutdown(sctx)
	}()
	go func() {
		defer close(done)
		if err := srv.Serve(h.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("health server stopped", "err", err)
		}
	}()
	slog.Info("serving health", "addr", h.ln.Addr().String(), "paths", "/healthz /readyz")
	return func() { cancel(); <-done }
}

func (h *health) close() {
	if h.ln != nil {
		h.ln.Close()
	}
}
