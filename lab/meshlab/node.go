package meshlab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Config of a node.
type Config struct {
	Name   string // netlab lab name (1..6 characters)
	Subnet int    // netlab subnet
	Mesh   Mesh
	Exe    string // eztunnel binary: the echo/stream server
	// Placement of every process of the node (CPU affinity, niceness).
	Placement workload.Placement
	Log       io.Writer
}

// Node is a lab node with a client pod, a server pod running every server,
// and the proxies of its mesh mode. All pods are in the lab's managed
// cgroup subtree, so the datapath sees apps and proxies alike.
type Node struct {
	cfg    Config
	Lab    *netlab.Lab
	Client *netlab.Pod
	Server *netlab.Pod
	Proxy  *netlab.Pod // ambient's node proxy; nil otherwise
	Dir    string      // scratch: configs, certificate, web root
	ctx    context.Context
	cancel context.CancelFunc
	procs  []*Proc
}

// New builds the node, starts the servers and the mesh. On error, and when
// ctx is cancelled later, Close still removes everything.
func New(ctx context.Context, cfg Config) (_ *Node, err error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	n := &Node{cfg: cfg}
	n.ctx, n.cancel = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Close())
		}
	}()
	if n.Dir, err = os.MkdirTemp("", "ezlab-"); err != nil {
		return nil, err
	}
	os.Chmod(n.Dir, 0o755) // nginx workers and the proxy uid read from it
	if n.Lab, err = netlab.New(cfg.Name, cfg.Subnet); err != nil {
		return nil, err
	}
	if n.Client, err = n.Lab.AddPod("cli", true); err != nil {
		return nil, err
	}
	if n.Server, err = n.Lab.AddPod("srv", true); err != nil {
		return nil, err
	}
	if cfg.Mesh.Kind == "ambient" {
		if n.Proxy, err = n.Lab.AddPod("node", true); err != nil {
			return nil, err
		}
	}
	if err := n.startServers(); err != nil {
		return nil, err
	}
	if err := n.startMesh(); err != nil {
		return nil, fmt.Errorf("mesh %s: %w", cfg.Mesh, err)
	}
	return n, nil
}

// Addr is the server pod's address for port, as the client dials it.
func (n *Node) Addr(port int) string {
	return net.JoinHostPort(n.Server.IPv4.String(), strconv.Itoa(port))
}

// Procs are the node's long-running processes (servers and proxies).
func (n *Node) Procs() []*Proc { return append([]*Proc(nil), n.procs...) }

// Close stops every process and removes pods, bridge, cgroups (and with
// the namespaces the iptables rules) and the scratch directory.
func (n *Node) Close() error {
	n.cancel()
	var errs []error
	// The lab kills every process of its cgroups first: nginx's workers
	// hold the master's output pipe, so the master's Wait returns only then.
	if n.Lab != nil {
		errs = append(errs, n.Lab.Close())
	}
	for _, p := range n.procs {
		<-p.done
	}
	if n.Dir != "" {
		errs = append(errs, os.RemoveAll(n.Dir))
	}
	return errors.Join(errs...)
}

func (n *Node) startServers() error {
	s := n.Server
	if _, err := n.start("echo", s, []int{PortStream, PortEcho, PortEchoKernel, PortPool}, n.cfg.Exe, "workload", "serve",
		"--stream", ":"+strconv.Itoa(PortStream), "--echo", ":"+strconv.Itoa(PortEcho), "--echo", ":"+strconv.Itoa(PortEchoKernel),
		"--pool", ":"+strconv.Itoa(PortPool)); err != nil {
		return err
	}
	if _, err := n.start("redis-server", s, []int{PortRedis}, "redis-server", "--port", strconv.Itoa(PortRedis),
		"--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no",
		"--dir", n.Dir, "--logfile", ""); err != nil {
		return err
	}
	www := filepath.Join(n.Dir, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		return err
	}
	// A small static page, the size of nginx's default index.html.
	page := "<!DOCTYPE html><html><head><title>eztunnel lab</title></head><body>" +
		strings.Repeat("<p>eztunnel benchmark page</p>", 18) + "</body></html>\n"
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte(page), 0o644); err != nil {
		return err
	}
	conf := filepath.Join(n.Dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConfig(n.Dir)), 0o644); err != nil {
		return err
	}
	_, err := n.start("nginx", s, []int{PortHTTP}, "nginx", "-c", conf, "-p", n.Dir, "-e", filepath.Join(n.Dir, "nginx-error.log"))
	return err
}

// startMesh writes the proxies' configs, starts them and installs capture.
func (n *Node) startMesh() error {
	m := n.cfg.Mesh
	cert := filepath.Join(n.Dir, "proxy.pem")
	if m.TLS {
		if err := writeSelfSigned(cert); err != nil {
			return fmt.Errorf("certificate: %w", err)
		}
	}
	switch m.Kind {
	case "none":
		return nil
	case "sidecar":
		cfg := filepath.Join(n.Dir, "sidecar.cfg")
		if err := n.writeProxyConfig(cfg, SidecarConfig(m.TLS, cert, "")); err != nil {
			return err
		}
		for _, p := range []*netlab.Pod{n.Client, n.Server} {
			if _, err := n.start("haproxy-"+p.Name, p, []int{PortOutbound, PortOutboundKernel, PortInbound, PortInboundKernel}, "haproxy", "-f", cfg, "-db"); err != nil {
				return err
			}
			if err := InstallCapture(n.ctx, p, SidecarCapture()); err != nil {
				return err
			}
		}
		return nil
	case "ambient":
		cfg := filepath.Join(n.Dir, "nodeproxy.cfg")
		if err := n.writeProxyConfig(cfg, nodeProxyConfig(n.Server.IPv4, m.TLS, cert)); err != nil {
			return err
		}
		var ports []int
		for _, p := range servicePorts {
			ports = append(ports, p, p+ambientInboundOffset)
		}
		if _, err := n.start("haproxy-node", n.Proxy, ports, "haproxy", "-f", cfg, "-db"); err != nil {
			return err
		}
		return InstallCapture(n.ctx, n.Client, AmbientCapture(n.Server.IPv4, n.Proxy.IPv4))
	}
	return fmt.Errorf("unknown mesh kind %q", m.Kind)
}

func (n *Node) writeProxyConfig(path, cfg string) error {
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return err
	}
	if out, err := sysexec.Command(n.ctx, "haproxy", "-c", "-q", "-f", path).CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy -c %s: %w: %s", path, err, out)
	}
	return nil
}
