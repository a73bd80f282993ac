package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// peerServer answers each TCP connection on p:port with "<client address
// as the backend sees it>|<sha256 of what it read>".
func peerServer(t *testing.T, p *multinode.Pod, v6 bool, port uint16) {
	t.Helper()
	ln := listenAt(t, p.Do, "tcp", netip.AddrPortFrom(p.Addr(v6), port))
	serve(ln, func(c net.Conn) {
		h := sha256.New()
		if _, err := io.Copy(h, c); err == nil {
			fmt.Fprintf(c, "%s|%x", c.RemoteAddr(), h.Sum(nil))
		}
	})
}

// peerUDPServer answers each datagram on p:port with "<p's name>|<client
// address as the backend sees it>|<datagram>".
func peerUDPServer(t *testing.T, p *multinode.Pod, v6 bool, port uint16) {
	t.Helper()
	var pc net.PacketConn
	if err := p.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(p.Addr(v6), port).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(fmt.Appendf(nil, "%s|%s|%s", p.Name, from, buf[:n]), from)
		}
	}()
}

// externalTCP sends size random bytes from the external host to to and
// returns the client address the backend saw; the stream must be exact.
func externalTCP(t *testing.T, ext *multinode.External, to netip.AddrPort, size int) (seen string, err error) {
	return externalTCPFrom(t, ext, 0, to, size)
}

// externalTCPFrom is externalTCP from local port port (0: any). Fixed
// ports are below the ephemeral range (32768-60999 in a new namespace):
// an earlier ephemeral connection in TIME_WAIT (without SO_REUSEADDR)
// would make bind fail with EADDRINUSE.
func externalTCPFrom(t *testing.T, ext *multinode.External, port int, to netip.AddrPort, size int) (seen string, err error) {
	var c net.Conn
	d := net.Dialer{Timeout: 3 * time.Second}
	if port != 0 {
		d.LocalAddr = &net.TCPAddr{Port: port}
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
			return serr
		}
	}
	if err := ext.Do(func() (err error) {
		c, err = d.Dial("tcp", to.String())
		return err
	}); err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	data := make([]byte, size)
	rand.Read(data)
	if _, err := c.Write(data); err != nil {
		return "", err
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	seen, sum, _ := strings.Cut(string(got), "|")
	if want := fmt.Sprintf("%x", sha256.Sum256(data)); sum != want {
		t.Errorf("external -> %s: %d bytes arrived with sha256 %s, sent %s", to, size, sum, want)
	}
	return seen, nil
}

// TestServicesNodePort: `eztunnel run --services --nodeport` on node 1 of
// a 2-node lab (host-gw) answers NodePorts from the external host on the
// node's uplink address: externalTrafficPolicy Cluster reaches backends on
// both nodes masqueraded to the node's address, Local reaches the node's
// own backend with the client's address kept; TCP byte-exact, UDP, IPv4 and
// IPv6. The node's FORWARD rules still decide, the NodePort keeps working
// while the agent is stopped (pinned), and nothing answers after uninstall
// (or before the agent ran: nothing listens on the node).
// TestServicesNodePort runs with tcx where the kernel has it, and with
// legacy tc filters (the path before Linux 6.6) on every kernel.
func TestServicesNodePort(t *testing.T) {
	if bpfsys.UseTCX() {
		t.Run("tcx", func(t *testing.T) { servicesNodePort(t, "mnnp") })
	} else {
		t.Log("this kernel has no tcx links: legacy tc only")
	}
	t.Run("legacy-tc", func(t *testing.T) {
		t.Setenv("EZTUNNEL_TEST_LEGACY_TC", "1")
		servicesNodePort(t, "mnnl")
	})
}

func servicesNodePort(t *testing.T, name string) {
	l := newMultinode(t, multinode.Options{Name: name, Nodes: 2, Mode: multinode.HostGW})
	n1, n2 := l.Node(1), l.Node(2)
	a1, b1 := mnPod(t, n1, "a1"), mnPod(t, n2, "b1")
	for _, p := range []*multinode.Pod{a1, b1} {
		for _, v6 := range []bool{false, true} {
			peerServer(t, p, v6, 8080)
			peerServer(t, p, v6, 8081)
			peerUDPServer(t, p, v6, 8053)
		}
	}
	be := func(p *multinode.Pod, v6 bool, port int) string {
		return fmt.Sprintf("%q", netip.AddrPortFrom(p.Addr(v6), uint16(port)))
	}
	file := fmt.Sprintf(`services:
- {name: web, ip: 10.96.7.10, port: 80, nodePort: 30080, backends: [%s, %s]}
- {name: web, ip: "fd96::7:10", port: 80, nodePort: 30080, backends: [%s, %s]}
- {name: local, ip: 10.96.7.11, port: 80, nodePort: 30081, externalTrafficPolicy: Local, backends: [%s, %s], localBackends: [%s]}
- {name: dns, ip: 10.96.7.12, port: 53, protocol: UDP, nodePort: 30053, backends: [%s, %s]}
- {name: none, ip: 10.96.7.13, port: 80, nodePort: 30083, externalTrafficPolicy: Local, backends: [%s], localBackends: []}
- {name: local2, ip: 10.96.7.14, port: 80, nodePort: 30084, externalTrafficPolicy: Local, backends: [%s], localBackends: [%s]}
`, be(a1, false, 8080), be(b1, false, 8080), be(a1, true, 8080), be(b1, true, 8080),
		be(a1, false, 8081), be(b1, false, 8081), be(a1, false, 8081),
		be(a1, false, 8053), be(b1, false, 8053), be(b1, false, 8081), be(a1, false, 8081), be(a1, false, 8081))
	svcFile := filepath.Join(t.TempDir(), "services.yaml")
	writeServices(t, svcFile, file)
	pin := "/sys/fs/bpf/eztunnel-e2e-" + name
	uninstall := func() {
		var out bytes.Buffer
		cmd := n1.Cmd(context.Background(), bin, "uninstall", "--pin-path", pin, "--drain-timeout", "5s")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := n1.Run(cmd); err != nil {
			t.Errorf("uninstall: %v: %s", err, out.String())
		}
	}
	t.Cleanup(func() {
		if _, err := os.Stat(pin); err == nil {
			uninstall()
		}
	})
	node4 := netip.AddrPortFrom(n1.UnderlayV4, 30080)
	node6 := netip.AddrPortFrom(n1.UnderlayV6, 30080)
	local := netip.AddrPortFrom(n1.UnderlayV4, 30081)
	ext := l.External

	if _, err := externalTCP(t, ext, node4, 1000); err == nil {
		t.Fatalf("%s answered before the agent ran: the test would prove nothing", node4)
	}

	ag := startNodeAgent(t, t, n1, "run", "--bypass=false", "--cgroup", n1.Managed, "--pin-path", pin,
		"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false", "--metrics-addr", bpMetricsAddr,
		"--services", "--services-file", svcFile, "--nodeport")
	mc := nodeClient(n1)
	before := scrapeWith(t, mc, bpMetricsAddr)
	if np := partOf(t, statusParts(t, pin).Parts, parts.NodePort); !np.Runs || strings.Contains(np.Via, "legacy tc") == bpfsys.UseTCX() {
		t.Fatalf("nodeport part %+v, want it running with legacy tc %v", np, !bpfsys.UseTCX())
	}

	t.Run("cluster", func(t *testing.T) {
		for _, to := range []netip.AddrPort{node4, node6} {
			for i := range 6 {
				seen, err := externalTCP(t, ext, to, 256<<10+i)
				if err != nil {
					t.Fatalf("external -> %s: %v", to, err)
				}
				// Masqueraded to the node address the client used.
				if ap, err := netip.ParseAddrPort(seen); err != nil || ap.Addr() != to.Addr() {
					t.Errorf("external -> %s: the backend saw %s, want the node's %s", to, seen, to.Addr())
				}
			}
		}
	})
	t.Run("client port reused", func(t *testing.T) {
		// The backend closes first: the client's socket is gone at once,
		// conntrack's entry stays in TIME_WAIT. A new connection from the
		// same port is a new flow (a kube-proxy-style rule would DNAT it
		// again): it must get the NodePort's NAT too.
		for i := range 3 {
			if _, err := externalTCPFrom(t, ext, 21234, node4, 1000+i); err != nil {
				t.Fatalf("connection %d from port 21234: %v", i, err)
			}
		}
	})
	t.Run("reply tuple taken", func(t *testing.T) {
		// Two Local NodePorts with one backend, one client port: the
		// second flow's reply tuple (backend -> client:port) is the first's,
		// still in conntrack (TIME_WAIT). As on the kernel path, nf_nat
		// gives the second flow another source port.
		for _, np := range []uint16{30081, 30084, 30081} {
			if _, err := externalTCPFrom(t, ext, 21300, netip.AddrPortFrom(n1.UnderlayV4, np), 100); err != nil {
				t.Fatalf("to NodePort %d from port 21300: %v", np, err)
			}
		}
	})
	t.Run("local", func(t *testing.T) {
		for i := range 4 {
			seen, err := externalTCP(t, ext, local, 64<<10+i)
			if err != nil {
				t.Fatalf("external -> %s: %v", local, err)
			}
			if ap, err := netip.ParseAddrPort(seen); err != nil || ap.Addr() != ext.IPv4 {
				t.Errorf("externalTrafficPolicy Local: the backend saw %s, want the client's %s", seen, ext.IPv4)
			}
		}
		// No local backend: left to the kernel path (nothing listens).
		if _, err := externalTCP(t, ext, netip.AddrPortFrom(n1.UnderlayV4, 30083), 100); err == nil {
			t.Error("a Local NodePort without local backend answered")
		}
	})
	t.Run("udp", func(t *testing.T) {
		var c net.Conn
		if err := ext.Do(func() (err error) {
			c, err = net.Dial("udp", netip.AddrPortFrom(n1.UnderlayV4, 30053).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 2048)
		var backend string
		for i := range 20 {
			msg := fmt.Sprintf("datagram %d", i)
			c.Write([]byte(msg))
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("datagram %d: %v", i, err)
			}
			parts := strings.SplitN(string(buf[:n]), "|", 3)
			if len(parts) != 3 || parts[2] != msg {
				t.Fatalf("datagram %d: reply %q", i, buf[:n])
			}
			if backend == "" {
				backend = parts[0]
			} else if parts[0] != backend {
				t.Errorf("datagram %d went to %s, the flow's first to %s", i, parts[0], backend)
			}
			if ap, err := netip.ParseAddrPort(parts[1]); err != nil || ap.Addr() != n1.UnderlayV4 {
				t.Errorf("datagram %d: the backend saw %s, want the node's %s", i, parts[1], n1.UnderlayV4)
			}
		}
	})
	t.Run("firewall holds", func(t *testing.T) {
		nsExec(t, n1.NetNS, "iptables", "-w", "-I", "FORWARD", "-s", ext.IPv4.String(), "-j", "DROP")
		_, err := externalTCP(t, ext, local, 100)
		nsExec(t, n1.NetNS, "iptables", "-w", "-D", "FORWARD", "-s", ext.IPv4.String(), "-j", "DROP")
		if err == nil {
			t.Error("a FORWARD DROP of the external host did not stop a NodePort connection")
		}
		if _, err := externalTCP(t, ext, local, 100); err != nil {
			t.Errorf("after the rule's removal: %v", err)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		m := scrapeWith(t, mc, bpMetricsAddr)
		k := `eztunnel_services_translations_total{kind="nodeport"}`
		// 12 cluster + 4 local + 1 UDP + 2 for the firewall test (the
		// dropped SYN set its flow up too) at least.
		if d := m[k] - before[k]; d < 19 {
			t.Errorf("%s grew by %v, want at least 19", k, d)
		}
		nb := `eztunnel_services_failures_total{reason="nodeport_no_backend"}`
		if d := m[nb] - before[nb]; d < 1 {
			t.Errorf("%s grew by %v, want at least 1", nb, d)
		}
	})
	t.Run("stopped then uninstalled", func(t *testing.T) {
		ag.stop(t)
		if _, err := externalTCP(t, ext, node4, 1000); err != nil {
			t.Errorf("agent stopped: the pinned NodePort does not answer: %v", err)
		}
		uninstall()
		if _, err := externalTCP(t, ext, node4, 1000); err == nil {
			t.Error("after uninstall the NodePort still answers")
		}
		if on := tcxChains(t, n1.NetNS, n1.Handle); slices.ContainsFunc(on, func(p tcxProg) bool { return p.Name == "ez_svc_nodeport" }) {
			t.Errorf("after uninstall, the NodePort program is still attached: %+v", on)
		}
	})
	_ = n2
}
