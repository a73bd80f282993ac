package meshmatrix

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Ports of the chain, in every pod (sidecar style, explicit ports: no
// iptables capture; `bench lab --mesh sidecar` covers the capture).
const (
	PortOutbound = 15001 // the sidecar's outbound listener, 127.0.0.1
	// PortOutboundKernel is the same listener on another port, which the
	// agents of a paired run exclude from the shortcut (--exclude-ports):
	// a connection to it stays on the kernel path.
	PortOutboundKernel = 15002
	PortInbound        = 15006 // the sidecar's inbound listener, on the pod IP
	PortApp            = 8080  // the app (nginx), 127.0.0.1
)

// The bodies the backend serves: wrk asks for the small page; the
// integrity probe also fetches the large one (many segments on every hop).
const (
	smallPage = "index.html"
	bigPage   = "big.bin"
	smallSize = 612 // nginx's default index.html
	bigSize   = 256 << 10
)

// chain is the three pods of the HTTP chain and what runs in them:
//
//	client (node 1): wrk -> 127.0.0.1:15001 HAProxy sidecar (outbound)
//	  -> front (node 2): HAProxy sidecar :15006 (inbound) -> nginx proxy tier 127.0.0.1:8080
//	     -> 127.0.0.1:15001 the same sidecar (outbound)
//	  -> back (node 1): HAProxy sidecar :15006 (inbound) -> nginx 127.0.0.1:8080 (static page)
//
// Six TCP legs per request: four over a pod's own loopback (app <-> sidecar,
// the socket shortcut's) and two between the nodes (sidecar to sidecar, the
// tc bypass's). Every proxy keeps connections alive and reuses them.
type chain struct {
	client, front, back *multinode.Pod
	dir                 string
	place               workload.Placement
	bodies              map[string][]byte // page name -> content
	mu                  sync.Mutex
	procs               []*proc
}

type proc struct {
	name string
	pod  *multinode.Pod
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
}

// sidecarConfig is an HAProxy sidecar in HTTP mode (as Envoy is for HTTP):
// outbound to upstream (if valid), inbound on the pod's address to the app.
func sidecarConfig(podAddr, upstream netip.Addr) string {
	var b strings.Builder
	b.WriteString(`global
    maxconn 8192

defaults
    mode http
    timeout connect 5s
    timeout client 5m
    timeout server 5m
    timeout http-keep-alive 5m
`)
	if upstream.IsValid() {
		fmt.Fprintf(&b, `
frontend outbound
    bind 127.0.0.1:%d
    bind 127.0.0.1:%d
    default_backend upstream

backend upstream
    http-reuse always
    server next %s
`, PortOutbound, PortOutboundKernel, netip.AddrPortFrom(upstream, PortInbound))
	}
	if podAddr.IsValid() {
		fmt.Fprintf(&b, `
frontend inbound
    bind %s
    default_backend app

backend app
    http-reuse always
    server app 127.0.0.1:%d
`, netip.AddrPortFrom(podAddr, PortInbound), PortApp)
	}
	return b.String()
}

// nginxConfig is one nginx worker in dir, logs off, on 127.0.0.1:8080: a
// proxy tier to the pod's outbound sidecar (proxy true, upstream
// connections kept alive) or the static pages of dir/www.
func nginxConfig(dir string, proxy bool) string {
	site := fmt.Sprintf("root %s/www;", dir)
	upstream := ""
	if proxy {
		upstream = fmt.Sprintf(`
    upstream sidecar {
        server 127.0.0.1:%d;
        keepalive 256;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }`, PortOutbound)
		site = `location / {
            proxy_pass http://sidecar;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }`
	}
	return fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_temp_path %[1]s/nginx-body;
    proxy_temp_path %[1]s/nginx-proxy;
    fastcgi_temp_path %[1]s/nginx-fastcgi;
    uwsgi_temp_path %[1]s/nginx-uwsgi;
    scgi_temp_path %[1]s/nginx-scgi;%[2]s
    server {
        listen 127.0.0.1:%[3]d;
        %[4]s
    }
}
`, dir, upstream, PortApp, site)
}

// newChain writes the configurations and pages under dir.
func newChain(client, front, back *multinode.Pod, dir string, place workload.Placement) (*chain, error) {
	c := &chain{client: client, front: front, back: back, dir: dir, place: place, bodies: map[string][]byte{}}
	small := bytes.Repeat([]byte("eztunnel mesh-matrix\n"), smallSize/21+1)[:smallSize]
	big := make([]byte, bigSize)
	rand.Read(big)
	c.bodies[smallPage], c.bodies[bigPage] = small, big
	files := map[string]string{
		"client/haproxy.cfg":    sidecarConfig(netip.Addr{}, front.IPv4),
		"front/haproxy.cfg":     sidecarConfig(front.IPv4, back.IPv4),
		"back/haproxy.cfg":      sidecarConfig(back.IPv4, netip.Addr{}),
		"front/nginx.conf":      nginxConfig(filepath.Join(dir, "front"), true),
		"back/nginx.conf":       nginxConfig(filepath.Join(dir, "back"), false),
		"back/www/" + smallPage: string(small),
		"back/www/" + bigPage:   string(big),
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	for _, f := range []string{"client/haproxy.cfg", "front/haproxy.cfg", "back/haproxy.cfg"} {
		if out, err := sysexec.Command(context.Background(), "haproxy", "-c", "-q", "-f", filepath.Join(dir, f)).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("haproxy -c %s: %w: %s", f, err, out)
		}
	}
	return c, nil
}

// start starts every proxy and server, the backend first, and waits until
// each listens.
func (c *chain) start(ctx context.Context) error {
	steps := []struct {
		pod   *multinode.Pod
		name  string
		argv  []string
		ports []int
	}{
		{c.back, "nginx", c.nginxArgv("back"), []int{PortApp}},
		{c.back, "haproxy", c.haproxyArgv("back"), []int{PortInbound}},
		{c.front, "nginx", c.nginxArgv("front"), []int{PortApp}},
		{c.front, "haproxy", c.haproxyArgv("front"), []int{PortInbound, PortOutbound}},
		{c.client, "haproxy", c.haproxyArgv("client"), []int{PortOutbound, PortOutboundKernel}},
	}
	for _, s := range steps {
		if err := c.run(ctx, s.pod, s.name, s.argv, s.ports); err != nil {
			c.stop()
			return err
		}
	}
	return nil
}

func (c *chain) nginxArgv(pod string) []string {
	d := filepath.Join(c.dir, pod)
	return []string{"nginx", "-c", filepath.Join(d, "nginx.conf"), "-p", d, "-e", filepath.Join(d, "nginx-error.log")}
}

func (c *chain) haproxyArgv(pod string) []string {
	return []string{"haproxy", "-f", filepath.Join(c.dir, pod, "haproxy.cfg"), "-db"}
}

func (c *chain) run(ctx context.Context, pod *multinode.Pod, name string, argv []string, ports []int) error {
	p := &proc{name: name, pod: pod, done: make(chan struct{})}
	p.cmd = pod.Cmd(ctx, argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.WaitDelay = 2 * time.Second // nginx's worker holds the output pipe
	if err := c.place.Start(func() error { return pod.Start(p.cmd) }); err != nil {
		return fmt.Errorf("%s in %s: %w", name, pod.Name, err)
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	go func() { p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		missing, err := notListening(pod, ports)
		if err == nil && len(missing) == 0 {
			return nil
		}
		select {
		case <-p.done:
			elog, _ := os.ReadFile(filepath.Join(c.dir, pod.Name, "nginx-error.log"))
			return fmt.Errorf("%s in %s exited (%v): %s %s", name, pod.Name, p.cmd.ProcessState, strings.TrimSpace(p.out.String()), elog)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s in %s: ports %v not listening after 15 s (%v): %s", name, pod.Name, missing, err, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills every process of the three pods (nginx's workers too) and
// waits for them.
func (c *chain) stop() {
	for _, p := range []*multinode.Pod{c.client, c.front, c.back} {
		killCgroup(p.Cgroup)
	}
	c.mu.Lock()
	procs := c.procs
	c.procs = nil
	c.mu.Unlock()
	for _, p := range procs {
		<-p.done
	}
}

// killCgroup SIGKILLs every process in cgroup, one by one, and waits
// briefly for it to empty. Not cgroup.kill (netlab.KillCgroupTree): on this
// kernel (6.18) a process started later into a cgroup once killed that way
// with CLONE_INTO_CGROUP (as the lab starts them) is SIGKILLed at its
// fork, so the chain could not start again in the same pods.
func killCgroup(cgroup string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
		pids := strings.Fields(string(b))
		if len(pids) == 0 || time.Now().After(deadline) {
			return
		}
		for _, f := range pids {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// placement lists each process of the chain's pods with its allowed CPUs,
// read from /proc: what the bench really ran with.
func (c *chain) placement() string {
	var parts []string
	for _, pod := range []*multinode.Pod{c.client, c.front, c.back} {
		b, _ := os.ReadFile(filepath.Join(pod.Cgroup, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			comm, _ := os.ReadFile("/proc/" + f + "/comm")
			status, _ := os.ReadFile("/proc/" + f + "/status")
			cpus := "?"
			for _, l := range strings.Split(string(status), "\n") {
				if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
					cpus = strings.TrimSpace(v)
				}
			}
			parts = append(parts, fmt.Sprintf("%s/%s CPUs %s", pod.Name, strings.TrimSpace(string(comm)), cpus))
		}
	}
	return strings.Join(parts, ", ")
}

// probe fetches every page n times through the whole chain with curl in
// the client pod (a connection each) and checks each body byte for byte.
func (c *chain) probe(ctx context.Context, wl workload.Client, n int) error {
	for _, page := range []string{smallPage, bigPage} {
		want := sha256.Sum256(c.bodies[page])
		for i := range n {
			out, _, err := wl.Run(ctx, c.client, 30*time.Second, "curl", "--silent", "--show-error", "--fail",
				"--max-time", "10", "http://127.0.0.1:"+strconv.Itoa(PortOutbound)+"/"+page)
			if err != nil {
				return fmt.Errorf("integrity probe %s #%d: %w", page, i+1, err)
			}
			if got := sha256.Sum256(out); got != want {
				return fmt.Errorf("integrity probe %s #%d: %d bytes, sha256 %x, want %d bytes, sha256 %x",
					page, i+1, len(out), got[:8], len(c.bodies[page]), want[:8])
			}
		}
	}
	return nil
}

// notListening returns the ports of ports with no IPv4 TCP listener in
// the pod's namespace (sock_diag).
func notListening(p *multinode.Pod, ports []int) ([]int, error) {
	h, err := p.Handle()
	if err != nil {
		return ports, err
	}
	defer h.Close()
	socks, err := h.SocketDiagTCP(unix.AF_INET)
	if err != nil {
		return ports, fmt.Errorf("sock_diag in %s: %w", p.NetNS, err)
	}
	have := map[int]bool{}
	for _, s := range socks {
		if s.State == netlink.TCP_LISTEN {
			have[int(s.ID.SourcePort)] = true
		}
	}
	var missing []int
	for _, port := range ports {
		if !have[port] {
			missing = append(missing, port)
		}
	}
	if len(missing) > 0 {
		return missing, errors.New("not listening yet")
	}
	return nil, nil
}
