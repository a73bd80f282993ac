package services

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Datapaths, in the order of the first round.
const (
	IPTables = "iptables"
	NFTables = "nftables"
	Eztunnel = "eztunnel"
)

// The histograms each datapath reports its sync time in.
var syncMetrics = map[string][]string{
	IPTables: {"kubeproxy_network_programming_duration_seconds", "kubeproxy_sync_proxy_rules_duration_seconds"},
	NFTables: {"kubeproxy_network_programming_duration_seconds", "kubeproxy_sync_proxy_rules_duration_seconds"},
	Eztunnel: {"eztunnel_services_sync_seconds"},
}

const (
	metricsAddr = "127.0.0.1:10249" // kube-proxy's or the agent's, in the node's netns
	pinPath     = "/sys/fs/bpf/eztunnel-svcbench"
)

// running is one started datapath.
type running struct {
	name string
	stop func() error
	logs *bytes.Buffer
	node *multinode.Node
}

// daemonEnv: kube-proxy execs iptables-restore or nft from PATH.
func daemonEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
}

func startProc(ctx context.Context, n *multinode.Node, name, prog string, args ...string) (*running, error) {
	cctx, cancel := context.WithCancel(ctx)
	cmd := n.Cmd(cctx, prog, args...)
	cmd.Env = daemonEnv()
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := n.Start(cmd); err != nil {
		cancel()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return &running{name: name, logs: logs, node: n, stop: func() error {
		defer cancel()
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return nil // a signalled exit is how kube-proxy stops
			}
			return err
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			return errors.New("no exit 30 s after SIGTERM")
		}
	}}, nil
}

// startKubeProxy runs kube-proxy standalone in the node's netns (its rules
// live there only) in mode iptables or nftables.
func startKubeProxy(ctx context.Context, o Options, n *multinode.Node, mode, kubeconfig, tmp string) (*running, error) {
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s, qps: 1000, burst: 2000}
mode: %s
clusterCIDR: %s,%s
hostnameOverride: %s
metricsBindAddress: %s
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, masqueradeAll: false}
`, kubeconfig, mode, multinode.ClusterV4, multinode.ClusterV6, n.Name, metricsAddr)
	path := filepath.Join(tmp, "kube-proxy-"+mode+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	return startProc(ctx, n, "kube-proxy "+mode, filepath.Join(o.BinDir, "kube-proxy"), "--config", path, "--v=1")
}

// cleanupKubeProxy removes what kube-proxy programmed in the node's netns
// (iptables and nftables): the next datapath starts from a clean node.
func cleanupKubeProxy(ctx context.Context, o Options, n *multinode.Node) error {
	cmd := n.Cmd(ctx, filepath.Join(o.BinDir, "kube-proxy"), "--cleanup", "--v=0")
	cmd.Env = daemonEnv()
	out, err := cmd.CombinedOutput()
	if err != nil && !onlyIPVSErrors(string(out)) {
		return fmt.Errorf("kube-proxy --cleanup: %w: %s", err, out)
	}
	// Nothing of iptables mode may be left (nftables mode's tables are
	// removed by the same --cleanup, which reported no error for them).
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		out, err := n.Cmd(ctx, save).Output()
		if err != nil {
			return fmt.Errorf("%s in %s: %w", save, n.NetNS, err)
		}
		if strings.Contains(string(out), "KUBE-SVC-") || strings.Contains(string(out), "KUBE-SERVICES") {
			return fmt.Errorf("kube-proxy --cleanup left its %s rules in %s", save, n.NetNS)
		}
	}
	return nil
}

// onlyIPVSErrors: --cleanup also tears down IPVS mode, which fails without
// ipset (not installed: the bench does not run IPVS mode); any other error
// counts.
func onlyIPVSErrors(out string) bool {
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "E") || strings.Contains(l, "ipset") || strings.Contains(l, "tearing down rules") {
			continue
		}
		return false
	}
	return true
}

// NodePortFlag reports whether the agent accepts --nodeport (the NodePort
// datapath is being added in parallel).
func NodePortFlag(ctx context.Context, agent string) bool {
	out, _ := sysexec.Command(ctx, agent, "run", "--help").CombinedOutput()
	return strings.Contains(string(out), "--nodeport")
}

// startAgent runs `eztunnel run --services` in the node's netns, attached to
// the pods' cgroup, the socket shortcut excluded for every address and the
// bridge bypass off (only Service translation differs from kube-proxy's
// path).
func startAgent(ctx context.Context, o Options, n *multinode.Node, kubeconfig, tmp string, nodePort bool) (*running, error) {
	ready := filepath.Join(tmp, "agent-ready")
	os.Remove(ready)
	args := []string{"run", "--services", "--kubeconfig", kubeconfig, "--cgroup", n.Managed, "--pin-path", pinPath,
		"--lock-file", filepath.Join(tmp, "agent.lock"), "--adopt=false", "--exclude-cidrs", "0.0.0.0/0,::/0", "--bypass=false",
		"--metrics-addr", metricsAddr, "--ready-file", ready}
	if nodePort {
		args = append(args, "--nodeport", "--node-name", n.Name)
	}
	r, err := startProc(ctx, n, "eztunnel", o.Agent, args...)
	if err != nil {
		return nil, err
	}
	stop := r.stop
	r.stop = func() error {
		err := stop()
		out, uerr := sysexec.Command(context.Background(), o.Agent, "uninstall", "--pin-path", pinPath, "--drain-timeout", "1s").CombinedOutput()
		if uerr != nil {
			err = errors.Join(err, fmt.Errorf("uninstall: %w: %s", uerr, out))
		}
		return err
	}
	if err := workload.WaitReady(ctx, ready, time.Minute, nil); err != nil {
		r.stop()
		return nil, fmt.Errorf("agent: %w\n%s", err, r.logs.String())
	}
	return r, nil
}

// scrape reads the datapath's metrics in the node's netns.
func scrape(n *multinode.Node) (map[string]*dto.MetricFamily, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = n.Do(func() (err error) {
				var d net.Dialer
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// hist is a cumulative histogram summed over its series.
type hist struct {
	bounds []float64
	counts []float64
	n      float64
}

func histOf(fams map[string]*dto.MetricFamily, name string) hist {
	var h hist
	f := fams[name]
	if f == nil {
		return h
	}
	byBound := map[float64]float64{}
	for _, m := range f.GetMetric() {
		if m.Histogram == nil {
			continue
		}
		h.n += float64(m.GetHistogram().GetSampleCount())
		for _, b := range m.GetHistogram().GetBucket() {
			byBound[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
	}
	for b := range byBound {
		h.bounds = append(h.bounds, b)
	}
	sort.Float64s(h.bounds)
	for _, b := range h.bounds {
		h.counts = append(h.counts, byBound[b])
	}
	return h
}

// minus is h's observations since before.
func (h hist) minus(before hist) hist {
	out := hist{bounds: h.bounds, n: h.n - before.n}
	for i, b := range h.bounds {
		c := h.counts[i]
		for j, bb := range before.bounds {
			if bb == b {
				c -= before.counts[j]
			}
		}
		out.counts = append(out.counts, c)
	}
	return out
}

// quantile interpolates within the bucket, as histogram_quantile does.
func (h hist) quantile(q float64) float64 {
	if h.n <= 0 {
		return math.NaN()
	}
	rank := q * h.n
	lo, prev := 0.0, 0.0
	for i, b := range h.bounds {
		if h.counts[i] >= rank {
			if math.IsInf(b, 1) {
				return lo
			}
			if h.counts[i] == prev {
				return b
			}
			return lo + (b-lo)*(rank-prev)/(h.counts[i]-prev)
		}
		lo, prev = b, h.counts[i]
	}
	return lo
}

// nodePortProgStats sums the kernel's run-time statistics of every loaded
// ez_svc_nodeport program (the bench's agent's: the kernel-tests lock
// keeps other agents away).
func nodePortProgStats() (bench.ProgStat, error) {
	p, err := bench.OpenProgs("ez_svc_nodeport")
	if err != nil {
		return bench.ProgStat{}, err
	}
	defer p.Close()
	m, err := p.Read()
	return m["ez_svc_nodeport"], err
}
