package svcsync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/kube"
	"github.com/eztunnel/eztunnel/internal/kubeapi"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// Node is the load balancer attached to the agent's cgroups. Its maps
// and links are pinned with the datapath: a restart adopts them (links
// updated in place, frontends rebuilt from the maps, then converged to the
// source) and translated sockets keep their reverse translation.
type Node struct {
	mu      sync.Mutex
	cfg     Options
	lb      *lb.LB // nil once closed
	table   *Table
	metrics *Metrics
	health  *HealthServer // nil: none
	cancel  context.CancelFunc
	// pods is Kubernetes mode's watch of the node's pods, which the pods
	// left to their proxy share (nil: the load balancer watches them).
	pods *kube.PodWatch
	// unreachable counts the network namespaces of the managed cgroups'
	// processes the agent could not enter at the last look (netNS): their
	// sockets to a removed backend would stay open.
	unreachable atomic.Int64
}

// netnsProbeEvery is how often the namespaces of the managed cgroups'
// processes are checked between removals of backends.
const netnsProbeEvery = 10 * time.Second

// netNS lists the network namespaces the load balancer destroys sockets in
// ("" for the agent's own, entered by nobody) and counts, in unreachable,
// the processes whose namespace the agent may not open (no host PID
// namespace: cgroup.procs shows them as 0; no CAP_SYS_PTRACE over them) and
// the namespaces it may not enter (setns: CAP_SYS_ADMIN). Namespaces of
// processes that exited meanwhile are skipped.
func (s *Node) netNS(cgroups []string) ([]string, error) {
	nss, denied, err := podnet.NetNamespaces(cgroups)
	if err != nil {
		return nil, err
	}
	var self syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &self); err != nil {
		return nil, err
	}
	out, bad := []string{""}, denied
	for _, ns := range nss {
		var st syscall.Stat_t
		if err := syscall.Stat(ns, &st); err != nil || st.Ino == self.Ino {
			continue
		}
		if err := bpfsys.InNetNSPath(ns, func() error { return nil }); err != nil {
			if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
				bad++
			}
			continue
		}
		out = append(out, ns)
	}
	if old := s.unreachable.Swap(int64(bad)); old != int64(bad) {
		if bad > 0 {
			slog.Warn("services: pod network namespaces the agent cannot enter: their sockets to removed backends stay open",
				"unreachable", bad, "need", "the host PID namespace, CAP_SYS_ADMIN and CAP_SYS_PTRACE (the chart grants them with services.enabled)")
		} else {
			slog.Info("services: every pod network namespace can be entered again")
		}
	}
	return out, nil
}

// NotReady is the readiness check of socket destroy: why the agent is not
// ready ("" when every namespace can be entered).
func (s *Node) NotReady() string {
	if n := s.unreachable.Load(); n > 0 {
		return fmt.Sprintf("services: %d pod network namespaces cannot be entered, sockets to removed backends would stay open "+
			"(needs the host PID namespace, CAP_SYS_ADMIN and CAP_SYS_PTRACE)", n)
	}
	return ""
}

// NewNode runs the agent's side of the load balancer the datapath
// loaded and attached: its source and NodePort devices (start).
func NewNode(cfg Options, l *lb.LB) *Node {
	if n := l.Frontends(); n > 0 {
		slog.Info("services: adopting the frontends an earlier agent pinned", "frontends", n)
	}
	s := &Node{cfg: cfg, lb: l, cancel: func() {}}
	s.metrics = NewMetrics(s.counters, SkipReasons)
	s.table = NewTable(l, s.metrics, nil)
	return s
}

// nodePortResync is how often the NodePort devices and node addresses are
// looked at again (devices and addresses may come and go).
const nodePortResync = 5 * time.Second

// syncNodePort converges the NodePort devices and the node addresses.
func (s *Node) syncNodePort(first bool) error {
	devs, addrs, err := podnet.NodePortDevices(s.cfg.NodePortDevices)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lb == nil {
		return nil
	}
	if err := s.lb.SetNodeAddrs(addrs); err != nil {
		return err
	}
	attached, detached, err := s.lb.SyncNodePortDevices(devs)
	if first || len(attached)+len(detached) > 0 {
		slog.Info("services: NodePort devices converged", "devices", devs, "attached", attached, "detached", detached, "node_addresses", addrs)
	}
	return err
}

// nodeFamilies: IPv4 always, IPv6 unless disabled on the node.
func nodeFamilies() Families {
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
	return Families{IPv4: true, IPv6: err == nil && strings.TrimSpace(string(b)) == "0"}
}

// Start applies the source's first state (the datapath attached the
// load balancer to the cgroups); the
// source keeps applying changes until close.
func (s *Node) Start(ctx context.Context, cgroups []string) error {
	// Sockets of a removed backend are looked for in the namespaces of the
	// managed cgroups' processes; those the agent cannot enter are counted
	// (eztunnel_services_netns_unreachable) and fail readiness, looked at
	// again every netnsProbeEvery.
	s.lb.SetNetNS(func() ([]string, error) { return s.netNS(cgroups) })
	ctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	if _, err := s.netNS(cgroups); err != nil {
		slog.Warn("services: list the pods' network namespaces", "err", err)
	}
	go every(ctx, netnsProbeEvery, func() {
		if _, err := s.netNS(cgroups); err != nil {
			slog.Warn("services: list the pods' network namespaces", "err", err)
		}
	})
	if s.cfg.NodePort {
		if err := s.syncNodePort(true); err != nil {
			cancel()
			return fmt.Errorf("--nodeport: %w", err)
		}
		go every(ctx, nodePortResync, func() {
			if err := s.syncNodePort(false); err != nil {
				slog.Warn("services: NodePort devices (retried)", "err", err)
			}
		})
	} else if _, _, err := s.lb.SyncNodePortDevices(nil); err != nil {
		cancel()
		return fmt.Errorf("--services: detach the NodePort program of an earlier agent: %w", err)
	}
	fam := nodeFamilies()
	var err error
	if s.cfg.File != "" {
		err = RunFile(ctx, s.cfg.File, fam, s.table, nil)
	} else {
		rc, rerr := kube.RESTConfig(kube.Config{Kubeconfig: s.cfg.Kubeconfig})
		if rerr != nil {
			cancel()
			return fmt.Errorf("--services: %w", rerr)
		}
		node := s.cfg.NodeName
		if node == "" {
			node, _ = os.Hostname()
		}
		if s.cfg.NodePort {
			s.health = NewHealthServer(s.cfg.HealthCheckAddrs, nil)
		}
		err = RunKube(ctx, KubeConfig{REST: rc, Families: fam, NodeName: node, Health: s.health}, s.table)
		if err == nil {
			go s.watchProxied(ctx, node)
		}
	}
	if err != nil {
		cancel()
		s.health.Close()
		return fmt.Errorf("--services: %w", err)
	}
	// The source's first state is written: what an earlier agent pinned
	// and no Service has now goes, and so do its links of cgroups no
	// longer managed.
	if gone := s.table.Prune(s.lb.List); len(gone) > 0 {
		slog.Info("services: deleted frontends no Service has any more", "frontends", len(gone))
	}
	if pruned, err := s.lb.Prune(); err != nil {
		slog.Warn("services: detach cgroups of an earlier agent", "err", err)
	} else if len(pruned) > 0 {
		slog.Info("services: detached cgroups no longer managed", "cgroup_ids", pruned)
	}
	slog.Info("services: load balancer attached (pinned: it stays while the agent restarts)",
		"cgroups", s.lb.Attached(), "frontends", s.lb.Frontends(), "ipv6", fam.IPv6)
	return nil
}

// watchProxied keeps the pods of node left to their proxy (the
// eztunnel.io/services annotation) written until ctx ends. A pod waits for
// its cgroup as selected pods do; a deleted pod, or one whose annotation
// went, is translated at the socket again. An annotation that does not
// parse is logged once per pod and value and counted; the pod keeps the
// default. Pods an earlier agent left to their proxy stay so until the
// first state.
func (s *Node) watchProxied(ctx context.Context, node string) {
	cfg := s.cfg.Pods
	cfg.Kubeconfig, cfg.NodeName, cfg.Default, cfg.SelfUID = s.cfg.Kubeconfig, node, "", ""
	cfg.Select = func(p *kubeapi.Pod) bool {
		_, ok := p.Annotations[kube.ServicesKey]
		return ok
	}
	warned := map[string]string{} // pod UID -> invalid value logged
	apply := func(ts []kube.Target) error {
		var ps []lb.Proxied
		invalid := 0
		seen := map[string]bool{}
		for _, t := range ts {
			seen[t.UID] = true
			proxied, uid, hasUID, err := ParseChoice(t.Services)
			if err != nil {
				invalid++
				if warned[t.UID] != t.Services {
					warned[t.UID] = t.Services
					slog.Warn("services: invalid pod annotation, the pod is translated at the socket", "pod", t.Namespace+"/"+t.Name,
						"key", kube.ServicesKey, "err", err)
				}
				continue
			}
			if proxied {
				ps = append(ps, lb.Proxied{Cgroup: t.CgroupPath, UID: uid, HasUID: hasUID})
			}
		}
		for uid := range warned {
			if !seen[uid] {
				delete(warned, uid)
			}
		}
		s.table.SetProxied(ps, invalid)
		return nil
	}
	synced := func() { slog.Info("services: pods left to their proxy synced", "pods", s.proxiedPods()) }
	if s.pods != nil {
		s.pods.Add(ctx, cfg, apply, synced) // one watch of the pods with the pod selection
		return
	}
	if err := kube.Run(ctx, cfg, apply, synced); err != nil {
		// No pod cgroups here (no kubelet): no pod is left to a proxy.
		slog.Warn("services: pods left to their proxy: not watched, every pod is translated at the socket", "err", err)
		s.table.SetProxied(nil, 0)
	}
}

func (s *Node) proxiedPods() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lb == nil {
		return 0
	}
	return s.lb.ProxiedPods()
}

func (s *Node) counters() (lb.Counters, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lb == nil {
		return nil, fmt.Errorf("services: closed")
	}
	return s.lb.Counters()
}

// Close stops the source (the load balancer stays pinned and attached;
// the datapath releases its handles); safe to call twice.
func (s *Node) Close() {
	s.cancel()
	s.health.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lb = nil
}

// Collectors are the eztunnel_services_* metrics: the table's and the
// datapath's (Metrics), and the namespaces socket destroy cannot enter.
func (s *Node) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.metrics, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "eztunnel_services_netns_unreachable",
		Help: "Network namespaces of the managed pods' processes the agent could not enter at the last look (every 10 s and at each removed backend): their sockets to a removed backend are not destroyed. Non-zero fails readiness."},
		func() float64 { return float64(s.unreachable.Load()) })}
}

// SetPodWatch shares Kubernetes mode's watch of the node's pods, for the
// pods left to their proxy (nil: the load balancer watches them itself).
func (s *Node) SetPodWatch(w *kube.PodWatch) { s.pods = w }

// every runs fn every d until ctx ends.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
