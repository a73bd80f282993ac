package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	lbsvc "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/kube"
	"github.com/eztunnel/eztunnel/internal/svcsync"
)

// ServicesConfig is `run --services`: ClusterIP load balancing at the
// socket, fed by a file or the Kubernetes API.
type ServicesConfig struct {
	File       string // services file; "" = the Kubernetes API
	Kubeconfig string // "" = in-cluster configuration (without File)
}

// serviceLB is the load balancer attached to the agent's cgroups while the
// agent runs; nothing of it is pinned.
type serviceLB struct {
	mu      sync.Mutex
	cfg     ServicesConfig
	lb      *lbsvc.LB // nil once closed
	table   *svcsync.Table
	metrics *svcsync.Metrics
	cancel  context.CancelFunc
}

// loadServices loads the programs and checks the source's configuration;
// nothing is attached yet.
func loadServices(cfg ServicesConfig) (*serviceLB, error) {
	// The source's configuration is checked before anything is loaded.
	if cfg.File != "" {
		data, err := os.ReadFile(cfg.File)
		if err != nil {
			return nil, fmt.Errorf("--services-file: %w", err)
		}
		if _, _, err := svcsync.ParseFile(data, nodeFamilies()); err != nil {
			return nil, fmt.Errorf("--services-file %s: %w", cfg.File, err)
		}
	} else if _, err := kube.RESTConfig(kube.Config{Kubeconfig: cfg.Kubeconfig}); err != nil {
		return nil, fmt.Errorf("--services: %w", err)
	}
	l, err := lbsvc.Load(lbsvc.Config{})
	if err != nil {
		return nil, fmt.Errorf("--services: %w", err)
	}
	s := &serviceLB{cfg: cfg, lb: l, cancel: func() {}}
	s.metrics = svcsync.NewMetrics(s.counters)
	s.table = svcsync.NewTable(l, s.metrics, nil)
	return s, nil
}

// nodeFamilies: IPv4 always, IPv6 unless disabled on the node.
func nodeFamilies() svcsync.Families {
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
	return svcsync.Families{IPv4: true, IPv6: err == nil && strings.TrimSpace(string(b)) == "0"}
}

// start attaches to cgroups and applies the source's first state; the
// source keeps applying changes until close.
func (s *serviceLB) start(ctx context.Context, cgroups []string) error {
	for _, cg := range cgroups {
		if err := s.lb.Attach(cg); err != nil {
			return fmt.Errorf("--services: %w", err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	fam := nodeFamilies()
	var err error
	if s.cfg.File != "" {
		err = svcsync.RunFile(ctx, s.cfg.File, fam, s.table, nil)
	} else {
		rc, rerr := kube.RESTConfig(kube.Config{Kubeconfig: s.cfg.Kubeconfig})
		if rerr != nil {
			cancel()
			return fmt.Errorf("--services: %w", rerr)
		}
		err = svcsync.RunKube(ctx, svcsync.KubeConfig{REST: rc, Families: fam}, s.table)
	}
	if err != nil {
		cancel()
		return fmt.Errorf("--services: %w", err)
	}
	slog.Info("services: load balancer attached (not pinned: it is detached when the agent stops)",
		"cgroups", s.lb.Attached(), "frontends", s.lb.Frontends(), "ipv6", fam.IPv6)
	return nil
}

func (s *serviceLB) counters() (lbsvc.Counters, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lb == nil {
		return nil, fmt.Errorf("services: closed")
	}
	return s.lb.Counters()
}

// close stops the source and detaches everything; safe to call twice.
func (s *serviceLB) close() {
	s.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lb == nil {
		return
	}
	if err := s.lb.Close(); err != nil {
		slog.Warn("services: close", "err", err)
	}
	s.lb = nil
	slog.Info("services: load balancer detached (nothing of it was pinned)")
}
