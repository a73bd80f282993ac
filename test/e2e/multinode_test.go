package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// The multi-node lab on plain kernel networking (no eztunnel datapath):
// what the bridge bypass will be compared with.

const mnTransfer = 8 << 20

func newMultinode(t *testing.T, o multinode.Options) *multinode.Lab {
	t.Helper()
	l, err := multinode.New(o)
	if err != nil {
		t.Fatalf("multinode.New: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close lab %s: %v", o.Name, err)
		}
		assertClean(t, o.Name, "")
	})
	return l
}

func mnPod(t *testing.T, n *multinode.Node, name string) *multinode.Pod {
	t.Helper()
	p, err := n.AddPod(name, true)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// listenIn opens a listener of network on addr:0 inside a namespace (do is
// Pod.Do or External.Do), closed at the end of the test.
func listenIn(t *testing.T, do func(func() error) error, network string, addr netip.Addr) net.Listener {
	t.Helper()
	return listenAt(t, do, network, netip.AddrPortFrom(addr, 0))
}

// listenAt is listenIn on a given port.
func listenAt(t *testing.T, do func(func() error) error, network string, addr netip.AddrPort) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := do(func() (err error) {
		ln, err = net.Listen(network, addr.String())
		return err
	}); err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// listenUDPIn opens a UDP socket on p's address (port chosen by the
// kernel); the caller closes it.
func listenUDPIn(t *testing.T, p *multinode.Pod, v6 bool) net.PacketConn {
	t.Helper()
	var pc net.PacketConn
	if err := p.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(p.Addr(v6), 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return pc
}

func serve(ln net.Listener, fn func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(time.Minute))
				fn(c)
			}()
		}
	}()
}

// sinkServer answers each connection with the sha256 of what it read.
func sinkServer(t *testing.T, p *multinode.Pod, v6 bool) netip.AddrPort {
	ln := listenIn(t, p.Do, "tcp", p.Addr(v6))
	serve(ln, func(c net.Conn) {
		h := sha256.New()
		if _, err := io.Copy(h, c); err == nil {
			c.Write(h.Sum(nil))
		}
	})
	return netip.MustParseAddrPort(ln.Addr().String())
}

func dialFrom(p *multinode.Pod, network string, to netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := p.Do(func() (err error) {
		c, err = net.DialTimeout(network, to.String(), timeout)
		return err
	})
	return c, err
}

// transfer sends size random bytes from pod from to a sinkServer and checks
// the hash it answers.
func transfer(t *testing.T, from *multinode.Pod, to netip.AddrPort, size int) {
	t.Helper()
	c, err := dialFrom(from, "tcp", to, 10*time.Second)
	if err != nil {
		t.Fatalf("%s -> %s: %v", from.Name, to, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	data := make([]byte, size)
	rand.Read(data)
	want := sha256.Sum256(data)
	if _, err := c.Write(data); err != nil {
		t.Fatalf("%s -> %s: write: %v", from.Name, to, err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("%s -> %s: read hash: %v", from.Name, to, err)
	}
	if !bytes.Equal(got, want[:]) {
		t.Fatalf("%s -> %s: %d bytes arrived with sha256 %x, sent %x", from.Name, to, size, got, want)
	}
}

// udpEcho sends n sequenced datagrams from pod from to an echo server in
// pod to, one at a time, and checks every echo.
func udpEcho(t *testing.T, from, to *multinode.Pod, v6 bool, n int) {
	t.Helper()
	pc := listenUDPIn(t, to, v6)
	defer pc.Close()
	udpEchoOn(t, from, pc, n)
}

// udpEchoOn is udpEcho to an echo server on pc (a socket in the receiving
// pod). Datagram i carries i*10 bytes of padding (up to about 2 kB), so the
// last ones leave as IP fragments; udpFits counts those that do not.
func udpEchoOn(t *testing.T, from *multinode.Pod, pc net.PacketConn, n int) {
	t.Helper()
	go workload.ServeUDPEcho(pc)
	c, err := dialFrom(from, "udp", netip.MustParseAddrPort(pc.LocalAddr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for i := 0; i < n; i++ {
		msg := udpEchoMsg(from, i)
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("udp %s -> %s: %v", from.Name, pc.LocalAddr(), err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := c.Read(buf)
		if err != nil {
			t.Fatalf("udp %s -> %s: echo of datagram %d: %v", from.Name, pc.LocalAddr(), i, err)
		}
		if !bytes.Equal(buf[:k], msg) {
			t.Fatalf("udp %s -> %s: datagram %d echoed as %q", from.Name, pc.LocalAddr(), i, buf[:k])
		}
	}
}

func udpEchoMsg(from *multinode.Pod, i int) []byte {
	return fmt.Appendf(nil, "seq %d from %s %s", i, from.Name, strings.Repeat("x", i*10))
}

// udpFits is how many of udpEchoOn's n datagrams from pod from fit in one
// IPv4 packet of mtu bytes (UDP and IPv4 headers: 28 bytes).
func udpFits(from *multinode.Pod, n, mtu int) (fit int) {
	for i := 0; i < n; i++ {
		if len(udpEchoMsg(from, i))+28 <= mtu {
			fit++
		}
	}
	return fit
}

func TestMultinodeModes(t *testing.T) {
	for _, mode := range []multinode.Mode{multinode.HostGW, multinode.VXLAN} {
		t.Run(string(mode), func(t *testing.T) {
			name := "mnhg"
			if mode == multinode.VXLAN {
				name = "mnvx"
			}
			l := newMultinode(t, multinode.Options{Name: name, Nodes: 3, Mode: mode})
			n1, n2, n3 := l.Node(1), l.Node(2), l.Node(3)
			a1, a2 := mnPod(t, n1, "a1"), mnPod(t, n1, "a2")
			b1, c1 := mnPod(t, n2, "b1"), mnPod(t, n3, "c1")

			t.Run("devices", func(t *testing.T) { checkDevices(t, l, n1) })
			t.Run("exec", func(t *testing.T) { checkExec(t, l, a1) })
			for _, v6 := range []bool{false, true} {
				t.Run("tcp-"+family(v6), func(t *testing.T) {
					transfer(t, a1, sinkServer(t, a2, v6), mnTransfer) // same node
					transfer(t, a1, sinkServer(t, b1, v6), mnTransfer) // cross node
					transfer(t, c1, sinkServer(t, a2, v6), mnTransfer) // cross node, the other way
				})
				t.Run("udp-"+family(v6), func(t *testing.T) { udpEcho(t, a1, c1, v6, 50) })
			}
			t.Run("forward-rules", func(t *testing.T) {
				// Two at a time, on distinct pod pairs.
				for _, v := range []multinode.Verdict{multinode.Drop, multinode.Reject} {
					t.Run(string(v), func(t *testing.T) {
						t.Run("same-node", func(t *testing.T) {
							t.Parallel()
							if v == multinode.Drop {
								checkBlock(t, n1, a1, a2, v)
							} else {
								checkBlock(t, n1, a2, a1, v)
							}
						})
						t.Run("cross-node", func(t *testing.T) {
							t.Parallel()
							if v == multinode.Drop {
								checkBlock(t, n2, a1, b1, v) // at the receiver's node
							} else {
								checkBlock(t, n1, a1, b1, v) // at the sender's node
							}
						})
					})
				}
			})
			t.Run("clusterip", func(t *testing.T) { checkClusterIP(t, l, a1, b1, c1) })
			t.Run("masquerade", func(t *testing.T) { checkMasquerade(t, l, a1, b1) })
		})
	}
}

func checkDevices(t *testing.T, l *multinode.Lab, n *multinode.Node) {
	ds, err := n.Devices()
	if err != nil {
		t.Fatal(err)
	}
	h, err := n.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	byRole := map[multinode.Role][]multinode.Device{}
	for _, d := range ds {
		byRole[d.Role] = append(byRole[d.Role], d)
		lk, err := h.LinkByIndex(d.Index)
		if err != nil || lk.Attrs().Name != d.Name {
			t.Fatalf("%s %s: ifindex %d in %s is not it (%v)", d.Role, d.Name, d.Index, n.NetNS, err)
		}
		if len(d.Name) > 15 || !strings.HasPrefix(d.Name, multinode.Prefix+l.Name) {
			t.Errorf("device %q: want at most 15 bytes with prefix %s", d.Name, multinode.Prefix+l.Name)
		}
		switch d.Role {
		case multinode.RolePodVeth:
			br, _ := n.Device(multinode.RoleBridge)
			if _, ok := lk.(*netlink.Veth); !ok || lk.Attrs().MasterIndex != br.Index || d.Pod == nil {
				t.Errorf("pod veth %s: %s with master %d, want a veth port of %s (%d) with its pod", d.Name, lk.Type(), lk.Attrs().MasterIndex, br.Name, br.Index)
			}
		case multinode.RoleVXLAN:
			if _, ok := lk.(*netlink.Vxlan); !ok {
				t.Errorf("vxlan device %s is a %s", d.Name, lk.Type())
			}
		case multinode.RoleUplink:
			addrs, err := h.AddrList(lk, unix.AF_INET)
			if err != nil || len(addrs) != 1 || !addrs[0].IP.Equal(n.UnderlayV4.AsSlice()) {
				t.Errorf("uplink %s: addresses %v (%v), want %s", d.Name, addrs, err, n.UnderlayV4)
			}
		}
	}
	want := map[multinode.Role]int{multinode.RoleBridge: 1, multinode.RoleUplink: 1, multinode.RolePodVeth: len(n.Pods())}
	if l.Mode == multinode.VXLAN {
		want[multinode.RoleVXLAN] = 1
	}
	for role, k := range want {
		if len(byRole[role]) != k {
			t.Errorf("node %s: %d %s devices, want %d", n.Name, len(byRole[role]), role, k)
		}
	}
	if len(byRole) != len(want) {
		t.Errorf("node %s: roles %v, want %v", n.Name, byRole, want)
	}
}

// checkExec runs a shell in a pod, a node and the external host and checks
// its cgroup and network namespace.
func checkExec(t *testing.T, l *multinode.Lab, p *multinode.Pod) {
	root, err := cgroupv2.Root()
	if err != nil {
		t.Fatal(err)
	}
	const script = "cat /proc/self/cgroup; readlink /proc/self/ns/net"
	n := p.Node
	for _, c := range []struct {
		what, netns, cgroup string
		cmd                 func() ([]byte, error)
	}{
		{"pod", p.NetNS, p.Cgroup, func() ([]byte, error) {
			var out bytes.Buffer
			cmd := p.Cmd(context.Background(), "sh", "-c", script)
			cmd.Stdout = &out
			err := p.Run(cmd)
			return out.Bytes(), err
		}},
		{"node", n.NetNS, n.System, func() ([]byte, error) {
			var out bytes.Buffer
			cmd := n.Cmd(context.Background(), "sh", "-c", script)
			cmd.Stdout = &out
			err := n.Run(cmd)
			return out.Bytes(), err
		}},
		{"external", l.External.NetNS, l.External.Cgroup, func() ([]byte, error) {
			var out bytes.Buffer
			cmd := l.External.Cmd(context.Background(), "sh", "-c", script)
			cmd.Stdout = &out
			err := l.External.Run(cmd)
			return out.Bytes(), err
		}},
	} {
		out, err := c.cmd()
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		var st unix.Stat_t
		if err := unix.Stat("/run/netns/"+c.netns, &st); err != nil {
			t.Fatal(err)
		}
		// Hybrid hierarchies list v1 controllers too: the v2 line is 0::.
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if strings.HasPrefix(line, "0::") || strings.HasPrefix(line, "net:") {
				got = append(got, line)
			}
		}
		want := []string{"0::" + strings.TrimPrefix(c.cgroup, root), fmt.Sprintf("net:[%d]", st.Ino)}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: ran in %q, want %q (output %q)", c.what, got, want, out)
		}
	}
}

// checkBlock adds a FORWARD rule from pod src to pod dst on node n, per
// family: TCP connects then fail as the verdict says and the rule counts
// them; after removal they succeed.
func checkBlock(t *testing.T, n *multinode.Node, src, dst *multinode.Pod, v multinode.Verdict) {
	t.Helper()
	var wg sync.WaitGroup
	for _, v6 := range []bool{false, true} {
		to := sinkServer(t, dst, v6)
		bits := 32
		if v6 {
			bits = 128
		}
		r, err := n.Block(netip.PrefixFrom(src.Addr(v6), bits), netip.PrefixFrom(dst.Addr(v6), bits), v)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			what := fmt.Sprintf("%s %s -> %s on %s (%s)", v, src.Name, dst.Name, n.Name, family(v6))
			// A DROP is a SYN never answered: wait a second. A REJECT's
			// ICMP can reach the client while connect still holds the
			// socket (it comes back synchronously over veths); IPv6 TCP
			// then keeps it as a soft error and the SYN retransmitted 1 s
			// later gets the refusal that ends connect.
			timeout := time.Second
			if v == multinode.Reject {
				timeout = 10 * time.Second
			}
			c, err := dialFrom(src, "tcp", to, timeout)
			if err == nil {
				c.Close()
				t.Errorf("%s: connected through the rule", what)
				return
			}
			switch v {
			case multinode.Drop:
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("%s: %v, want a timeout", what, err)
				}
			case multinode.Reject:
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("%s: %v, want ECONNREFUSED", what, err)
				}
			}
			if k, err := r.Packets(); err != nil || k == 0 {
				t.Errorf("%s: rule matched %d packets (%v), want some", what, k, err)
			}
			if err := r.Remove(); err != nil {
				t.Errorf("%s: remove: %v", what, err)
				return
			}
			c, err = dialFrom(src, "tcp", to, 10*time.Second)
			if err != nil {
				t.Errorf("%s removed: %v", what, err)
				return
			}
			c.Close()
		}()
	}
	wg.Wait()
}

// checkClusterIP connects from client to a service whose backends are on
// other nodes: each answer names its backend, the client's node has the
// DNAT in conntrack, and both backends answer in time.
func checkClusterIP(t *testing.T, l *multinode.Lab, client *multinode.Pod, backends ...*multinode.Pod) {
	const port = 8080
	// Backends listen on one port in both families.
	for _, b := range backends {
		for _, v6 := range []bool{false, true} {
			ln := listenAt(t, b.Do, "tcp", netip.AddrPortFrom(b.Addr(v6), port))
			serve(ln, func(c net.Conn) {
				fmt.Fprintf(c, "%s\n", b.Name)
				io.Copy(io.Discard, c)
			})
		}
	}
	svc, err := l.AddService("web", "tcp", 80, port, backends...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := svc.Remove(); err != nil {
			t.Errorf("remove service: %v", err)
		}
	}()
	h, err := client.Node.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, v6 := range []bool{false, true} {
		vip := netip.AddrPortFrom(svc.Addr(v6), 80)
		seen := map[string]bool{}
		for i := 0; i < 64 && len(seen) < len(backends); i++ {
			c, err := dialFrom(client, "tcp", vip, 10*time.Second)
			if err != nil {
				t.Fatalf("%s -> %s: %v", client.Name, vip, err)
			}
			c.SetDeadline(time.Now().Add(scaled(10 * time.Second)))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				c.Close()
				t.Fatalf("%s -> %s: %v", client.Name, vip, err)
			}
			be := l.Pod(strings.TrimSpace(line))
			if be == nil || be.Node == client.Node {
				c.Close()
				t.Fatalf("%s -> %s answered by %q", client.Name, vip, line)
			}
			if !seen[be.Name] {
				seen[be.Name] = true
				checkDNAT(t, h, client, c, vip, netip.AddrPortFrom(be.Addr(v6), port))
			}
			c.Close()
		}
		if len(seen) != len(backends) {
			t.Errorf("%s: 64 connections reached only %v", vip, seen)
		}
	}
}

// checkDNAT finds the open connection c in the conntrack table of the
// client's node: original destination the VIP, reply source the backend.
func checkDNAT(t *testing.T, h *netlink.Handle, client *multinode.Pod, c net.Conn, vip, backend netip.AddrPort) {
	t.Helper()
	fam := netlink.InetFamily(unix.AF_INET)
	if vip.Addr().Is6() {
		fam = unix.AF_INET6
	}
	flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil {
		t.Fatalf("conntrack in %s: %v", client.Node.NetNS, err)
	}
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	for _, f := range flows {
		o, r := f.Forward, f.Reverse
		if o.Protocol != unix.IPPROTO_TCP || !o.SrcIP.Equal(local.Addr().AsSlice()) || o.SrcPort != local.Port() {
			continue
		}
		if !o.DstIP.Equal(vip.Addr().AsSlice()) || o.DstPort != vip.Port() {
			t.Fatalf("conntrack: %s original destination %s:%d, want %s", local, o.DstIP, o.DstPort, vip)
		}
		if !r.SrcIP.Equal(backend.Addr().AsSlice()) || r.SrcPort != backend.Port() {
			t.Fatalf("conntrack: %s -> %s reply from %s:%d, want the backend %s", local, vip, r.SrcIP, r.SrcPort, backend)
		}
		return
	}
	t.Fatalf("conntrack of %s: no flow from %s (%d flows)", client.Node.NetNS, local, len(flows))
}

// checkMasquerade: pods reach the external host, which sees their node's
// underlay address; pod-to-pod traffic keeps the pod's address.
func checkMasquerade(t *testing.T, l *multinode.Lab, p, peer *multinode.Pod) {
	for _, v6 := range []bool{false, true} {
		ext := l.External.IPv4
		want := p.Node.UnderlayV4
		if v6 {
			ext, want = l.External.IPv6, p.Node.UnderlayV6
		}
		for _, c := range []struct {
			do     func(func() error) error
			addr   netip.Addr
			wantIP netip.Addr
		}{{l.External.Do, ext, want}, {peer.Do, peer.Addr(v6), p.Addr(v6)}} {
			ln := listenIn(t, c.do, "tcp", c.addr)
			serve(ln, func(conn net.Conn) { fmt.Fprintf(conn, "%s\n", conn.RemoteAddr()) })
			conn, err := dialFrom(p, "tcp", netip.MustParseAddrPort(ln.Addr().String()), 10*time.Second)
			if err != nil {
				t.Fatalf("%s -> %s: %v", p.Name, ln.Addr(), err)
			}
			conn.SetDeadline(time.Now().Add(scaled(10 * time.Second)))
			line, err := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if err != nil {
				t.Fatalf("%s -> %s: %v", p.Name, ln.Addr(), err)
			}
			seen, err := netip.ParseAddrPort(strings.TrimSpace(line))
			if err != nil || seen.Addr() != c.wantIP {
				t.Errorf("%s -> %s seen from %q, want %s", p.Name, ln.Addr(), line, c.wantIP)
			}
		}
	}
}

// TestMultinodePMTU: pods with MTU 1500 over a smaller hop between nodes
// (host-gw: a 1400 underlay; VXLAN: the 1450 overlay device). TCP with DF
// must learn the path MTU from the node's ICMP and stay byte-exact.
func TestMultinodePMTU(t *testing.T) {
	for _, c := range []struct {
		mode     multinode.Mode
		name     string
		underlay int
		pathMTU  int
	}{{multinode.HostGW, "mnph", 1400, 1400}, {multinode.VXLAN, "mnpv", 1500, 1450}} {
		t.Run(string(c.mode), func(t *testing.T) {
			l := newMultinode(t, multinode.Options{Name: c.name, Nodes: 2, Mode: c.mode, UnderlayMTU: c.underlay, PodMTU: 1500})
			a, b := mnPod(t, l.Node(1), "a"), mnPod(t, l.Node(2), "b")
			h, err := a.Handle()
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			for _, v6 := range []bool{false, true} {
				transfer(t, a, sinkServer(t, b, v6), mnTransfer)
				rs, err := h.RouteGet(b.Addr(v6).AsSlice())
				if err != nil || len(rs) == 0 {
					t.Fatalf("route to %s in %s: %v", b.Addr(v6), a.NetNS, err)
				}
				if rs[0].MTU != c.pathMTU {
					t.Errorf("%s: path MTU to %s learnt as %d, want %d", family(v6), b.Addr(v6), rs[0].MTU, c.pathMTU)
				}
			}
		})
	}
}

// TestMultinodeWire: a wire (bench bypass's floor) carries the two pods'
// traffic, both families, byte-exact, while its routes are on, and the
// bridge carries it again once they are off.
func TestMultinodeWire(t *testing.T) {
	l := newMultinode(t, multinode.Options{Name: "mnwr", Nodes: 2, Mode: multinode.HostGW})
	a, b := mnPod(t, l.Node(1), "a"), mnPod(t, l.Node(1), "b")
	if _, err := a.AddWire(mnPod(t, l.Node(2), "c")); err == nil {
		t.Error("a wire between pods of two nodes was made")
	}
	w, err := a.AddWire(b)
	if err != nil {
		t.Fatal(err)
	}
	// Packets b received over the wire, and through its bridge port.
	rx := func() (wire, port uint64) {
		t.Helper()
		for _, c := range []struct {
			handle func() (*netlink.Handle, error)
			dev    string
			n      *uint64
		}{{b.Handle, "wire0", &wire}, {l.Node(1).Handle, b.HostVeth, &port}} {
			h, err := c.handle()
			if err != nil {
				t.Fatal(err)
			}
			link, err := h.LinkByName(c.dev)
			h.Close()
			if err != nil {
				t.Fatal(err)
			}
			if c.dev == "wire0" {
				*c.n = link.Attrs().Statistics.RxPackets
			} else {
				*c.n = link.Attrs().Statistics.TxPackets // the node's side sends what b receives
			}
		}
		return wire, port
	}
	for _, on := range []bool{true, false} {
		if err := w.Route(on); err != nil {
			t.Fatal(err)
		}
		for _, v6 := range []bool{false, true} {
			w0, p0 := rx()
			transfer(t, a, sinkServer(t, b, v6), mnTransfer)
			udpEcho(t, a, b, v6, 50)
			w1, p1 := rx()
			over, through := w1-w0, p1-p0
			if on && (over < 100 || through > 10) {
				t.Errorf("routes on, %s: b received %d packets over the wire and %d through the bridge", family(v6), over, through)
			}
			if !on && (through < 100 || over > 10) {
				t.Errorf("routes off, %s: b received %d packets over the wire and %d through the bridge", family(v6), over, through)
			}
		}
	}
	if err := w.Route(false); err != nil {
		t.Errorf("routes off twice: %v", err)
	}
}

// TestMultinodeCleanup: Close leaves nothing; a lab whose process was
// SIGKILLed is removed by Sweep, and by the next New of its name.
func TestMultinodeCleanup(t *testing.T) {
	t.Run("close", func(t *testing.T) {
		const name = "mncl"
		l, err := multinode.New(multinode.Options{Name: name, Nodes: 3, Mode: multinode.VXLAN})
		if err != nil {
			t.Fatal(err)
		}
		p, err := l.Node(2).AddPod("busy", true)
		if err != nil {
			l.Close()
			t.Fatal(err)
		}
		// A process in the pod that only Close ends.
		pr, pw, err := os.Pipe()
		if err != nil {
			l.Close()
			t.Fatal(err)
		}
		defer pw.Close()
		cmd := p.Cmd(context.Background(), "sh", "-c", "read x")
		cmd.Stdin = pr
		err = p.Start(cmd)
		pr.Close()
		if err != nil {
			l.Close()
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := cmd.Wait(); err == nil {
			t.Errorf("the pod's process outlived Close")
		}
		assertClean(t, name, "")
		if _, err := os.Stat(filepath.Join("/run/eztunnel-labs", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("owner record of %s after Close: %v", name, err)
		}
	})
	const name = "mnkl"
	killed := func(t *testing.T) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := sysexec.Command(ctx, labBin, "multinode", "up", "--name", name, "--nodes", "3", "--mode", "vxlan", "--pods", "2")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		ready := false
		for !ready && sc.Scan() {
			ready = strings.HasPrefix(sc.Text(), "ready")
		}
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if !ready {
			t.Fatalf("eztunnel-lab multinode up never got ready")
		}
		left := labLeftovers(t, name, "")
		if len(left) < 3*2+3+2 { // pods, nodes, underlay, external
			t.Fatalf("the killed lab left only %v: nothing to prove cleanup with", left)
		}
		if _, err := os.Stat(filepath.Join("/run/eztunnel-labs", name)); err != nil {
			t.Fatalf("owner record of the killed lab: %v", err)
		}
	}
	t.Run("sigkill-sweep", func(t *testing.T) {
		killed(t)
		if err := multinode.Sweep(); err != nil {
			t.Errorf("sweep: %v", err)
		}
		assertClean(t, name, "")
		if _, err := os.Stat(filepath.Join("/run/eztunnel-labs", name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("owner record after Sweep: %v", err)
		}
	})
	t.Run("sigkill-claim", func(t *testing.T) {
		killed(t)
		l := newMultinode(t, multinode.Options{Name: name, Nodes: 2})
		p := mnPod(t, l.Node(1), "a")
		transfer(t, p, sinkServer(t, mnPod(t, l.Node(2), "b"), false), 1<<20)
	})
}
