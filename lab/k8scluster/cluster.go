// Package k8scluster brings up a real single-node Kubernetes cluster on this
// machine for the cluster tests and benchmarks, and tears it down: etcd,
// containerd + runc and the CNI plugins from Debian, the Kubernetes binaries
// built by tools/kube/build.sh, PKI generated here. Everything it makes lives
// under RunDir or has a fixed name (interfaces, iptables chains, kubepods
// cgroups, cni-* network namespaces), and what it changes on the host
// (sysctls) is recorded in RunDir/owner first, so Cleanup at the next Start
// removes what a killed run left. Lab code: the agent never imports it.
package k8scluster

import (
	"context"

	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// Fixed names and addresses of the one lab cluster this machine can run.
const (
	DefaultRunDir = "/var/lib/eztunnel-k8s"
	NodeName      = "ezk8s"
	NodeIP        = "10.250.0.1" // on the dummy interface NodeLink
	NodeLink      = "ezk8s0"     // dummy interface carrying NodeIP
	BridgeLink    = "ezk8sbr0"   // CNI bridge
	PodCIDR       = "10.244.0.0/24"
	ServiceCIDR   = "10.96.0.0/16"
	APIServiceIP  = "10.96.0.1" // the kubernetes Service
	APIPort       = 6443
	PauseImage    = "registry.local/eztunnel/pause:1"
	cniNetwork    = "ezk8s"
	fwdChain      = "EZK8S-FWD" // ours: keeps pod traffic on this machine
	etcdClient    = 12379
	etcdPeer      = 12380
)

// Config of a cluster.
type Config struct {
	// BinDir holds kube-apiserver, kube-controller-manager, kube-scheduler,
	// kubelet, kube-proxy and kubectl (tools/kube/build.sh prints it).
	BinDir string
	// RunDir holds every file of the cluster (DefaultRunDir if empty).
	RunDir string
	// PauseTar is the sandbox image as an OCI archive named PauseImage.
	PauseTar string
	// Pins are bpffs paths what runs in the cluster may pin (the agent's):
	// recorded, and removed by Cleanup if still there.
	Pins []string
	// Log receives progress lines (nil: discarded).
	Log io.Writer
}

// Cluster is a running cluster.
type Cluster struct {
	cfg        Config
	Kubeconfig string // admin (system:masters)
	Server     string // https://NodeIP:APIPort
	procs      []*proc
	sock       string // containerd
	pki        *pki
	advertise  string // the API server's address: NodeIP, or ControlPlaneConfig's
	svcCIDRs   string // --service-cluster-ip-range
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func (c *Cluster) logf(format string, args ...any) {
	if c.cfg.Log != nil {
		fmt.Fprintf(c.cfg.Log, "k8scluster: "+format+"\n", args...)
	}
}

func (c *Cluster) path(p ...string) string {
	return filepath.Join(append([]string{c.cfg.RunDir}, p...)...)
}

// Start cleans up what an earlier run left and brings the cluster up to a
// Ready node with a default ServiceAccount. On error it tears down what it
// made.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.RunDir == "" {
		cfg.RunDir = DefaultRunDir
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("k8scluster: %s missing in BinDir %q (make k8s-bin)", b, cfg.BinDir)
		}
	}
	if _, err := os.Stat(cfg.PauseTar); err != nil {
		return nil, fmt.Errorf("k8scluster: pause image: %w", err)
	}
	c := &Cluster{cfg: cfg, Server: fmt.Sprintf("https://%s:%d", NodeIP, APIPort), advertise: NodeIP, svcCIDRs: ServiceCIDR}
	if err := Cleanup(cfg.RunDir); err != nil {
		return nil, fmt.Errorf("k8scluster: removing an earlier run's leftovers: %w", err)
	}
	if err := claim(cfg.RunDir, cfg.Pins); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.logf("start failed: %v; logs:\n%s", err, c.LogTails(30))
			c.Stop()
		}
	}()
	t0 := time.Now()
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"host network", c.setupHost},
		{"pki", c.setupPKI},
		{"etcd", c.startEtcd},
		{"containerd", c.startContainerd},
		{"kube-apiserver", c.startAPIServer},
		{"controllers", c.startControllers},
		{"kubelet", c.startKubelet},
		{"kube-proxy", c.startKubeProxy},
		{"node ready", c.waitReady},
	}
	for _, s := range steps {
		t := time.Now()
		if err := s.fn(ctx); err != nil {
			return nil, fmt.Errorf("k8scluster: %s: %w", s.name, err)
		}
		c.logf("%s up in %.1fs", s.name, time.Since(t).Seconds())
	}
	c.logf("cluster up in %.1fs", time.Since(t0).Seconds())
	return c, nil
}

// ControlPlaneConfig is a control plane without a node: etcd and
// kube-apiserver only (bench services runs kube-proxy or the agent itself in
// a lab node's network namespace, and writes Nodes and EndpointSlices).
type ControlPlaneConfig struct {
	BinDir string
	RunDir string // DefaultRunDir if empty
	// AdvertiseIP is a host address the lab's namespaces reach the API
	// server at (in its certificate and kubeconfigs).
	AdvertiseIP string
	// ServiceCIDRv6, if set, makes the Service range dual-stack (at most
	// 20 host bits: /108).
	ServiceCIDRv6 string
	Log           io.Writer
}

// StartControlPlane runs etcd and kube-apiserver only; Stop and Cleanup as
// for Start. On error it tears down what it made.
func StartControlPlane(ctx context.Context, cfg ControlPlaneConfig) (_ *Cluster, err error) {
	if cfg.RunDir == "" {
		cfg.RunDir = DefaultRunDir
	}
	if net.ParseIP(cfg.AdvertiseIP) == nil {
		return nil, fmt.Errorf("k8scluster: advertise address %q is not an IP address", cfg.AdvertiseIP)
	}
	for _, b := range []string{"kube-apiserver", "kube-proxy", "kubectl"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("k8scluster: %s missing in BinDir %q (make k8s-bin)", b, cfg.BinDir)
		}
	}
	c := &Cluster{cfg: Config{BinDir: cfg.BinDir, RunDir: cfg.RunDir, Log: cfg.Log},
		Server: "https://" + net.JoinHostPort(cfg.AdvertiseIP, strconv.Itoa(APIPort)), advertise: cfg.AdvertiseIP, svcCIDRs: ServiceCIDR}
	if cfg.ServiceCIDRv6 != "" {
		c.svcCIDRs += "," + cfg.ServiceCIDRv6
	}
	if err := Cleanup(cfg.RunDir); err != nil {
		return nil, fmt.Errorf("k8scluster: removing an earlier run's leftovers: %w", err)
	}
	if err := claim(cfg.RunDir, nil); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.logf("start failed: %v; logs:\n%s", err, c.LogTails(30))
			c.Stop()
		}
	}()
	for _, s := range []struct {
		name string
		fn   func(context.Context) error
	}{{"pki", c.setupPKI}, {"etcd", c.startEtcd}, {"kube-apiserver", c.startAPIServer}} {
		t := time.Now()
		if err := s.fn(ctx); err != nil {
			return nil, fmt.Errorf("k8scluster: %s: %w", s.name, err)
		}
		c.logf("%s up in %.1fs", s.name, time.Since(t).Seconds())
	}
	return c, nil
}

// PKIPath is a file of the cluster's PKI dir (kube-proxy.kubeconfig, ca.crt).
func (c *Cluster) PKIPath(name string) string { return c.pki.path(name) }

// Stop tears the cluster down and removes everything it made.
func (c *Cluster) Stop() error {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	c.procs = nil
	err := Cleanup(c.cfg.RunDir)
	c.logf("stopped")
	return err
}

// env of every daemon: a fixed PATH of the system dirs (kubelet and
// kube-proxy run iptables, mount; containerd runs its shim and runc).
func daemonEnv() []string {
	return []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
}

// spawn starts a daemon with its output in RunDir/logs/name.log. Daemons
// die with this process (Pdeathsig); what they spawned (shims, pods) is
// left to Cleanup.
func (c *Cluster) spawn(name, prog string, args ...string) error {
	if err := os.MkdirAll(c.path("logs"), 0o755); err != nil {
		return err
	}
	f, err := os.Create(c.path("logs", name+".log"))
	if err != nil {
		return err
	}
	cmd := sysexec.Command(context.Background(), prog, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = daemonEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	c.procs = append(c.procs, p)
	return nil
}

// wait polls ok until it returns nil, a daemon exits, or timeout.
func (c *Cluster) wait(ctx context.Context, what string, timeout time.Duration, ok func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ok()
		if err == nil {
			return nil
		}
		for _, p := range c.procs {
			select {
			case <-p.done:
				return fmt.Errorf("%s exited (%v) while waiting for %s; its log:\n%s", p.name, p.err, what, tail(c.path("logs", p.name+".log"), 30))
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %s: %w", what, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.cfg.BinDir, name) }

func (c *Cluster) setupPKI(context.Context) error {
	p, err := newPKI(c.path("pki"), c.Server)
	if err != nil {
		return err
	}
	c.pki = p
	ips := []net.IP{net.ParseIP(c.advertise), net.ParseIP(APIServiceIP), net.ParseIP("127.0.0.1")}
	dns := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost", NodeName}
	if _, _, err := p.cert("apiserver", "kube-apiserver", nil, dns, ips); err != nil {
		return err
	}
	if _, _, err := p.cert("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil); err != nil {
		return err
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	for _, k := range []struct{ name, user, group string }{
		{"admin", "admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
		{"kubelet", "system:node:" + NodeName, "system:nodes"},
		{"kube-proxy", "system:kube-proxy", ""},
	} {
		var orgs []string
		if k.group != "" {
			orgs = []string{k.group}
		}
		path, err := p.kubeconfig(k.name, k.user, orgs...)
		if err != nil {
			return err
		}
		if k.name == "admin" {
			c.Kubeconfig = path
		}
	}
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	cl := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	peer := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	if err := c.spawn("etcd", "etcd", "--name", "default", "--data-dir", c.path("etcd"),
		"--listen-client-urls", cl, "--advertise-client-urls", cl,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer, "--listen-metrics-urls", "",
		"--log-level", "warn"); err != nil {
		return err
	}
	return c.wait(ctx, "etcd /health", 30*time.Second, func() error {
		r, err := http.Get(cl + "/health")
		if err != nil {
			return err
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(b), `"true"`) {
			return fmt.Errorf("etcd health: %s", b)
		}
		return nil
	})
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := c.pki.path
	if err := c.spawn("kube-apiserver", c.bin("kube-apiserver"),
		"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", etcdClient),
		"--advertise-address", c.advertise, "--bind-address", "0.0.0.0", "--secure-port", strconv.Itoa(APIPort),
		"--service-cluster-ip-range", c.svcCIDRs,
		"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"),
		"--client-ca-file", p("ca.crt"),
		"--kubelet-client-certificate", p("apiserver-kubelet-client.crt"),
		"--kubelet-client-key", p("apiserver-kubelet-client.key"),
		// The node's hostname resolves to 127.0.0.1, which the API server
		// refuses to proxy to (kubectl logs/exec): InternalIP first.
		"--kubelet-preferred-address-types", "InternalIP,Hostname",
		"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--authorization-mode", "Node,RBAC", "--allow-privileged=true",
		"--enable-admission-plugins", "NodeRestriction",
		"--profiling=false", "--v=1"); err != nil {
		return err
	}
	return c.wait(ctx, "kube-apiserver /readyz", 90*time.Second, func() error {
		_, err := c.Kubectl(ctx, "get", "--raw", "/readyz")
		return err
	})
}

func (c *Cluster) startControllers(ctx context.Context) error {
	p := c.pki.path
	if err := c.spawn("kube-controller-manager", c.bin("kube-controller-manager"),
		"--kubeconfig", p("controller-manager.kubeconfig"),
		"--authentication-kubeconfig", p("controller-manager.kubeconfig"),
		"--authorization-kubeconfig", p("controller-manager.kubeconfig"),
		"--service-account-private-key-file", p("sa.key"), "--root-ca-file", p("ca.crt"),
		"--use-service-account-credentials=true", "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--profiling=false", "--v=1"); err != nil {
		return err
	}
	return c.spawn("kube-scheduler", c.bin("kube-scheduler"),
		"--kubeconfig", p("scheduler.kubeconfig"),
		"--authentication-kubeconfig", p("scheduler.kubeconfig"),
		"--authorization-kubeconfig", p("scheduler.kubeconfig"),
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--profiling=false", "--v=1")
}

func (c *Cluster) startKubelet(context.Context) error {
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://%s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %s}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podCIDR: %s
podLogsDir: %s
resolvConf: /etc/resolv.conf
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%%, imagefs.available: 1%%, nodefs.inodesFree: 1%%}
protectKernelDefaults: false
`, c.sock, c.pki.path("ca.crt"), PodCIDR, c.path("pod-logs"))
	path := c.path("kubelet.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	return c.spawn("kubelet", c.bin("kubelet"), "--config", path,
		"--kubeconfig", c.pki.path("kubelet.kubeconfig"), "--root-dir", c.path("kubelet"),
		"--node-ip", NodeIP, "--hostname-override", NodeName, "--v=1")
}

func (c *Cluster) startKubeProxy(context.Context) error {
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, masqueradeAll: false}
nodePortAddresses: [%s/32]
`, c.pki.path("kube-proxy.kubeconfig"), PodCIDR, NodeName, NodeIP)
	path := c.path("kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	return c.spawn("kube-proxy", c.bin("kube-proxy"), "--config", path, "--v=1")
}

func (c *Cluster) waitReady(ctx context.Context) error {
	err := c.wait(ctx, "node Ready", 120*time.Second, func() error {
		out, err := c.Kubectl(ctx, "get", "node", NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(out)) != "True" {
			return fmt.Errorf("node Ready=%q", out)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return c.wait(ctx, "default ServiceAccount", 60*time.Second, func() error {
		_, err := c.Kubectl(ctx, "-n", "default", "get", "serviceaccount", "default")
		return err
	})
}

// Kubectl runs kubectl as admin and returns its stdout; the error carries
// stderr.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	return c.KubectlIn(ctx, nil, args...)
}

// KubectlIn is Kubectl with stdin.
func (c *Cluster) KubectlIn(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := sysexec.Command(ctx, c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig, "--request-timeout", "30s"}, args...)...)
	cmd.Stdin = stdin
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// LogTails returns the last n lines of every daemon's log.
func (c *Cluster) LogTails(n int) string {
	var b strings.Builder
	for _, p := range c.procs {
		fmt.Fprintf(&b, "--- %s ---\n%s\n", p.name, tail(c.path("logs", p.name+".log"), n))
	}
	return b.String()
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
