package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry holds c and the Go runtime and process collectors.
func Registry(c prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Server serves /metrics. Its address is bound by Listen, before there is
// anything to serve, so a taken address fails before the agent changes anything.
type Server struct {
	ln net.Listener
}

// Listen binds addr (host:port).
func Listen(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: %w", addr, err)
	}
	return &Server{ln: ln}, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close releases the address of a server that is not serving.
func (s *Server) Close() error { return s.ln.Close() }

// MaxScrapes is how many scrapes are served at once; the excess gets 503
// (Service Unavailable) at once, so a scrape storm costs the node little
// more than the accepts. ScrapeTimeout bounds one scrape (503 after it).
const (
	MaxScrapes    = 4
	ScrapeTimeout = 10 * time.Second
)

// Serve serves g on /metrics until ctx is done, then shuts down.
func (s *Server) Serve(ctx context.Context, g prometheus.Gatherer) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: slogAdapter{},
		MaxRequestsInFlight: MaxScrapes, Timeout: ScrapeTimeout}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: ScrapeTimeout + 5*time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := srv.Shutdown(sctx)
		if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = serr
		}
		return err
	}
}

// slogAdapter sends promhttp's errors to slog.
type slogAdapter struct{}

func (slogAdapter) Println(v ...any) { slog.Warn("serving metrics", "err", fmtArgs(v)) }

func fmtArgs(v []any) any {
	if len(v) == 1 {
		return v[0]
	}
	return v
}
