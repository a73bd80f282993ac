package e2e

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	"github.com/eztunnel/eztunnel/internal/podnet"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// The bridge bypass across nodes: pod egress to another node's pod goes
// from the pod's veth straight to the uplink (host-gw) or VXLAN device,
// and packets from there to a local pod straight into it, once each node's
// own netfilter admitted the flow.

// attachUplinks discovers n's uplinks from netlink (podnet) and attaches
// the bypass to them; they must be the lab's uplink (host-gw) or VXLAN
// device.
func attachUplinks(t *testing.T, l *multinode.Lab, n *multinode.Node, bp *bypass.Bypass) {
	t.Helper()
	h, err := n.Handle()
	if err != nil {
		t.Fatal(err)
	}
	st, err := podnet.Scan(h)
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	role := multinode.RoleUplink
	if l.Mode == multinode.VXLAN {
		role = multinode.RoleVXLAN
	}
	want, err := n.Device(role)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var ifx []int
	for _, u := range st.Uplinks {
		got = append(got, u.Name)
		ifx = append(ifx, u.Ifindex)
	}
	if len(got) != 1 || got[0] != want.Name {
		t.Fatalf("node %s (%s): podnet found uplinks %v, want [%s]", n.Name, l.Mode, got, want.Name)
	}
	if err := bp.AttachUplinks(ifx...); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(bp.Uplinks(), ifx) {
		t.Fatalf("uplinks attached %v, want %v", bp.Uplinks(), ifx)
	}
}

func linkStats(t *testing.T, n *multinode.Node, dev string) netlink.LinkStatistics {
	t.Helper()
	h, err := n.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lk, err := h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	return *lk.Attrs().Statistics
}

// viaStack is what the node stacks handled of traffic from pod src to
// pod dst on another node: bytes the source node's bridge took in to route
// (frames to its MAC) and bytes the destination node forwarded through its
// bridge into dst's veth. Bypassed frames skip both.
type viaStack struct{ srcBridgeRx, dstVethTx uint64 }

func stackBytes(t *testing.T, src, dst *multinode.Pod) viaStack {
	return viaStack{linkStats(t, src.Node, src.Node.Bridge).RxBytes, linkStats(t, dst.Node, dst.HostVeth).TxBytes}
}

func (a viaStack) sub(b viaStack) viaStack {
	return viaStack{a.srcBridgeRx - b.srcBridgeRx, a.dstVethTx - b.dstVethTx}
}

// xnodeTransfer sends mnTransfer bytes from src to dst (other node) and
// returns the bypass counter deltas of both nodes and the stack bytes.
func xnodeTransfer(t *testing.T, src, dst *multinode.Pod, bpSrc, bpDst *bypass.Bypass, v6 bool) (dSrc, dDst bypass.Counters, via viaStack) {
	t.Helper()
	to := sinkServer(t, dst, v6)
	var b1, b2 bypass.Counters
	if bpSrc != nil {
		b1, b2 = bpCounters(t, bpSrc), bpCounters(t, bpDst)
	}
	s0 := stackBytes(t, src, dst)
	transfer(t, src, to, mnTransfer)
	via = stackBytes(t, src, dst).sub(s0)
	if bpSrc != nil {
		dSrc, dDst = bpDelta(b1, bpCounters(t, bpSrc)), bpDelta(b2, bpCounters(t, bpDst))
	}
	return dSrc, dDst, via
}

func TestBypassCrossNode(t *testing.T) {
	for _, mode := range []multinode.Mode{multinode.HostGW, multinode.VXLAN} {
		t.Run(string(mode), func(t *testing.T) {
			name := "xbh"
			if mode == multinode.VXLAN {
				name = "xbv"
			}
			// Three nodes: each has routes to two others' pod CIDRs by its
			// one uplink (VXLAN device).
			l := newMultinode(t, multinode.Options{Name: name, Nodes: 3, Mode: mode})
			n1, n2, n3 := l.Node(1), l.Node(2), l.Node(3)
			a1, b1, c1 := mnPod(t, n1, "a1"), mnPod(t, n2, "b1"), mnPod(t, n3, "c1")
			for _, n := range []*multinode.Node{n1, n2, n3} {
				setBeLiberal(t, n, "1")
			}

			// The kernel path alone: every byte passes both stacks.
			_, _, plain := xnodeTransfer(t, a1, b1, nil, nil, false)
			t.Logf("plain: %+v", plain)
			if plain.srcBridgeRx < mnTransfer || plain.dstVethTx < mnTransfer {
				t.Fatalf("plain a1 -> b1: stacks saw %+v of %d bytes: the measure is wrong", plain, mnTransfer)
			}

			// UDP entries are refreshed to 300 s, more than conntrack ever
			// sets for UDP (120 s): a longer timeout proves the refresh.
			cfg := bypass.Config{UDPTimeout: 300 * time.Second}
			bp1, bp2 := attachBypass(t, n1, cfg), attachBypass(t, n2, cfg)
			attachUplinks(t, l, n1, bp1)
			attachUplinks(t, l, n2, bp2)
			bp3 := attachBypass(t, n3, cfg)
			attachUplinks(t, l, n3, bp3)
			bps := map[*multinode.Node]*bypass.Bypass{n1: bp1, n2: bp2, n3: bp3}

			for _, v6 := range []bool{false, true} {
				t.Run("tcp-"+family(v6), func(t *testing.T) {
					for _, c := range [][2]*multinode.Pod{{a1, b1}, {b1, a1}} {
						src, dst := c[0], c[1]
						what := fmt.Sprintf("%s %s -> %s", family(v6), src.Name, dst.Name)
						dSrc, dDst, via := xnodeTransfer(t, src, dst, bps[src.Node], bps[dst.Node], v6)
						t.Logf("%s: stacks %+v; source node %v; destination node %v", what, via, dSrc, dDst)
						if dSrc["bypassed_out_bytes"] < mnTransfer/2 || dDst["bypassed_in_bytes"] < mnTransfer/2 {
							t.Errorf("%s: bypassed out %d, in %d bytes of %d", what, dSrc["bypassed_out_bytes"], dDst["bypassed_in_bytes"], mnTransfer)
						}
						// The other direction (ACKs, the hash) too.
						if dDst["bypassed_out_packets"] == 0 || dSrc["bypassed_in_packets"] == 0 {
							t.Errorf("%s: the reverse direction was not bypassed: out %d, in %d packets", what, dDst["bypassed_out_packets"], dSrc["bypassed_in_packets"])
						}
						// On the flow cache's checks (recheck testRecheck).
						if dSrc["bypassed_cached_packets"] == 0 || dDst["bypassed_cached_packets"] == 0 {
							t.Errorf("%s: no packet went on the flow cache: source node %d, destination node %d", what, dSrc["bypassed_cached_packets"], dDst["bypassed_cached_packets"])
						}
						if via.srcBridgeRx >= mnTransfer/2 || via.dstVethTx >= mnTransfer/2 {
							t.Errorf("%s: the stacks still carried %+v bytes", what, via)
						}
						if dSrc["fallback_tcp_control"] == 0 || dSrc["admissions"] == 0 || dDst["admissions"] == 0 {
							t.Errorf("%s: the handshake did not take the kernel path: %v / %v", what, dSrc, dDst)
						}
						for _, d := range []bypass.Counters{dSrc, dDst} {
							for _, k := range []string{"fallback_other", "fallback_too_big", "fallback_nat", "fallback_route_mismatch", "fallback_unknown_device", "fallback_fib_other", "bypassed_packets"} {
								if d[k] != 0 {
									t.Errorf("%s: %s: %d", what, k, d[k])
								}
							}
						}
					}
				})
				t.Run("udp-"+family(v6), func(t *testing.T) {
					b1c, b2c := bpCounters(t, bp1), bpCounters(t, bp2)
					udpWindows(t, a1, b1, v6, 20, 50)
					d1, d2 := bpDelta(b1c, bpCounters(t, bp1)), bpDelta(b2c, bpCounters(t, bp2))
					t.Logf("n1 %v; n2 %v", d1, d2)
					// 1000 datagrams each way; the first ones set the flow up.
					for _, c := range []struct {
						what string
						n    uint64
					}{{"n1 out", d1["bypassed_out_packets"]}, {"n2 in", d2["bypassed_in_packets"]}, {"n2 out", d2["bypassed_out_packets"]}, {"n1 in", d1["bypassed_in_packets"]}} {
						if c.n < 900 {
							t.Errorf("%s: %d of 1000 datagrams bypassed", c.what, c.n)
						}
					}
					if d1["fallback_no_conntrack"] == 0 {
						t.Errorf("the first datagram did not take the kernel path: %v", d1)
					}
					// A blast whose flow switches to the bypass mid-burst
					// (when the echo passes): no reordering.
					b1c = bpCounters(t, bp2)
					if got, inv := udpBlast(t, a1, b1, v6, 5000); inv != 0 {
						t.Errorf("blast: %d of 5000 datagrams arrived, %d out of order", got, inv)
					}
					if d := bpDelta(b1c, bpCounters(t, bp2)); d["bypassed_in_packets"] == 0 || d["fallback_not_established"] == 0 {
						t.Errorf("blast: the flow did not switch to the bypass mid-burst: %v", d)
					}
					// Each node refreshed its own entry of the flow.
					checkUDPRefreshed(t, n1, a1.Addr(v6), b1.Addr(v6))
					checkUDPRefreshed(t, n2, a1.Addr(v6), b1.Addr(v6))
				})
			}

			if mode == multinode.HostGW {
				t.Run("no-neighbour", func(t *testing.T) {
					for _, v6 := range []bool{false, true} {
						checkNoNeighbour(t, bp1, n1, n2, a1, b1, v6)
					}
				})
			}
			t.Run("fragments-and-options", func(t *testing.T) {
				for _, v6 := range []bool{false, true} {
					checkFragmentsAndOptions(t, bp1, bp2, a1, b1, v6)
				}
			})
			t.Run("policy-routing", func(t *testing.T) {
				for _, v6 := range []bool{false, true} {
					checkPolicyRoute(t, bp1, n1, a1, b1, v6)
				}
			})
			t.Run("forward-rules", func(t *testing.T) {
				// New flows: the SYNs take the kernel path.
				checkBlock(t, n2, a1, b1, multinode.Drop)   // at the receiver's node
				checkBlock(t, n1, a1, b1, multinode.Reject) // at the sender's node
				for _, v6 := range []bool{false, true} {
					// Replies dropped at the replier's node (they leave b1
					// by the bypass's egress path) and at the client's
					// (they arrive at n1's uplink).
					checkUDPRepliesBlocked(t, bp2, n2, a1, b1, v6)
					checkUDPRepliesBlocked(t, bp1, n1, a1, b1, v6)
					checkDropEstablished(t, bp1, n1, a1, b1, v6)
				}
			})
			t.Run("masquerade", func(t *testing.T) {
				for _, v6 := range []bool{false, true} {
					checkMasqueradeNotBypassed(t, l, bp1, a1, v6)
				}
			})
			t.Run("clusterip", func(t *testing.T) {
				const port = 8082
				for _, v6 := range []bool{false, true} {
					sinkOn(listenAt(t, b1.Do, "tcp", netip.AddrPortFrom(b1.Addr(v6), port)))
				}
				svc, err := l.AddService("xweb", "tcp", 80, port, b1)
				if err != nil {
					t.Fatal(err)
				}
				defer svc.Remove()
				for _, v6 := range []bool{false, true} {
					before := bpCounters(t, bp1)
					transfer(t, a1, netip.AddrPortFrom(svc.Addr(v6), 80), 1<<20)
					d := bpDelta(before, bpCounters(t, bp1))
					t.Logf("%s n1: %v", family(v6), d)
					// The client's node DNATs: requests go to the VIP
					// (NAT), replies find an entry with NAT. The backend's
					// node sees plain pod-to-pod traffic.
					if d["fallback_nat"] == 0 || d["bypassed_out_packets"] != 0 || d["bypassed_in_packets"] != 0 {
						t.Errorf("%s a1 -> ClusterIP -> b1: n1 %v, want nat fallbacks and nothing bypassed", family(v6), d)
					}
				}
			})
			t.Run("third-node", func(t *testing.T) {
				for _, v6 := range []bool{false, true} {
					for _, c := range [][2]*multinode.Pod{{c1, a1}, {b1, c1}} {
						src, dst := c[0], c[1]
						dSrc, dDst, via := xnodeTransfer(t, src, dst, bps[src.Node], bps[dst.Node], v6)
						if dSrc["bypassed_out_bytes"] < mnTransfer/2 || dDst["bypassed_in_bytes"] < mnTransfer/2 || via.srcBridgeRx >= mnTransfer/2 || via.dstVethTx >= mnTransfer/2 {
							t.Errorf("%s %s -> %s: bypassed out %d, in %d bytes; stacks %+v", family(v6), src.Name, dst.Name, dSrc["bypassed_out_bytes"], dDst["bypassed_in_bytes"], via)
						}
					}
				}
			})
			t.Run("detached", func(t *testing.T) {
				for _, bp := range []*bypass.Bypass{bp1, bp2} {
					for _, ifx := range bp.Uplinks() {
						if err := bp.Detach(ifx); err != nil {
							t.Fatal(err)
						}
					}
				}
				// Without uplinks nothing goes to another node by the
				// bypass: the route's device is unknown to it.
				b1c := bpCounters(t, bp1)
				transfer(t, a1, sinkServer(t, b1, false), 1<<20)
				if d := bpDelta(b1c, bpCounters(t, bp1)); d["bypassed_out_packets"] != 0 || d["fallback_unknown_device"] == 0 {
					t.Errorf("uplinks detached: %v, want unknown_device fallbacks", d)
				}
			})
		})
	}
}

// checkMasqueradeNotBypassed: TCP from p to the external host is
// masqueraded by p's node exactly as without the bypass (the external host
// sees the node's address) and never bypassed.
func checkMasqueradeNotBypassed(t *testing.T, l *multinode.Lab, bp *bypass.Bypass, p *multinode.Pod, v6 bool) {
	t.Helper()
	ext, want := l.External.IPv4, p.Node.UnderlayV4
	if v6 {
		ext, want = l.External.IPv6, p.Node.UnderlayV6
	}
	ln := listenIn(t, l.External.Do, "tcp", ext)
	serve(ln, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", c.RemoteAddr())
		io.Copy(c, c)
	})
	before := bpCounters(t, bp)
	c, err := dialFrom(p, "tcp", netip.MustParseAddrPort(ln.Addr().String()), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(scaled(20 * time.Second)))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if seen, err := netip.ParseAddrPort(strings.TrimSpace(line)); err != nil || seen.Addr() != want {
		t.Errorf("%s %s -> external seen from %q, want %s", family(v6), p.Name, line, want)
	}
	// Data both ways on the established, masqueraded flow.
	msg := []byte(strings.Repeat("masquerade ", 20000))
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(r, got); err != nil || string(got) != string(msg) {
		t.Fatalf("%s %s -> external: echo %v", family(v6), p.Name, err)
	}
	d := bpDelta(before, bpCounters(t, bp))
	t.Logf("%s masquerade: %v", family(v6), d)
	if d["bypassed_out_packets"] != 0 || d["bypassed_in_packets"] != 0 || d["bypassed_packets"] != 0 {
		t.Errorf("%s %s -> external: bypassed: %v", family(v6), p.Name, d)
	}
	if d["fallback_nat"]+d["fallback_unknown_device"] == 0 {
		t.Errorf("%s %s -> external: no nat or unknown-device fallback: %v", family(v6), p.Name, d)
	}
}

// udpWindows sends windows*per sequenced datagrams from pod from to an
// echo server in pod to, per at a time without waiting, then reads their
// echoes. The server checks that datagrams arrive in order without gaps,
// the client that echoes do: no loss, no reordering, either way.
func udpWindows(t *testing.T, from, to *multinode.Pod, v6 bool, windows, per int) {
	t.Helper()
	pc := listenUDPIn(t, to, v6)
	defer pc.Close()
	bad := make(chan string, 1)
	go func() {
		buf := make([]byte, 2048)
		next := 0
		for {
			k, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if seq, err := strconv.Atoi(strings.Fields(string(buf[:k]))[0]); err != nil || seq != next {
				select {
				case bad <- fmt.Sprintf("server got %q, want sequence %d", buf[:k], next):
				default:
				}
			}
			next++
			pc.WriteTo(buf[:k], a)
		}
	}()
	c, err := dialFrom(from, "udp", netip.MustParseAddrPort(pc.LocalAddr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	seq := 0
	for w := 0; w < windows; w++ {
		for i := 0; i < per; i++ {
			if _, err := c.Write(fmt.Appendf(nil, "%d %s", seq+i, strings.Repeat("u", 100))); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < per; i++ {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			k, err := c.Read(buf)
			if err != nil {
				select {
				case m := <-bad:
					t.Fatalf("%s udp %s -> %s: %s", family(v6), from.Name, to.Name, m)
				default:
				}
				t.Fatalf("%s udp %s -> %s: echo of datagram %d: %v", family(v6), from.Name, to.Name, seq, err)
			}
			if got, _ := strconv.Atoi(strings.Fields(string(buf[:k]))[0]); got != seq {
				t.Fatalf("%s udp %s -> %s: echo %d, want %d (reordered or lost)", family(v6), from.Name, to.Name, got, seq)
			}
			seq++
		}
	}
	select {
	case m := <-bad:
		t.Fatalf("%s udp %s -> %s: %s", family(v6), from.Name, to.Name, m)
	default:
	}
}

// udpBlast sends sequenced datagrams from pod from to pod to as fast as it
// can on a new flow, and to answers datagram blastEcho only: the flow's
// first blastEcho+1 datagrams leave before any reply exists (the kernel
// path: not established), and the sender goes on until it has read the
// reply, then sends n more (established: the bypass), so the flow switches
// mid-burst whatever the scheduling. It returns how many arrived and how
// many arrived after a later one (losses are not counted: a burst may
// overflow the receive buffer, with or without the bypass).
func udpBlast(t *testing.T, from, to *multinode.Pod, v6 bool, n int) (got, inversions int) {
	t.Helper()
	const blastEcho, last = 100, math.MaxUint32
	pc := listenUDPIn(t, to, v6)
	defer pc.Close()
	done := make(chan [2]int, 1)
	go func() {
		buf := make([]byte, 2048)
		prev, got, inv := -1, 0, 0
		for {
			pc.SetReadDeadline(time.Now().Add(scaled(time.Second)))
			k, a, err := pc.ReadFrom(buf)
			if err != nil || k < 4 {
				done <- [2]int{got, inv}
				return
			}
			seq := binary.BigEndian.Uint32(buf)
			if seq == last {
				done <- [2]int{got, inv}
				return
			}
			if seq == blastEcho {
				pc.WriteTo(buf[:k], a)
			}
			if int(seq) < prev {
				inv++
			}
			prev = max(prev, int(seq))
			got++
		}
	}()
	c, err := dialFrom(from, "udp", netip.MustParseAddrPort(pc.LocalAddr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	msg, echo := make([]byte, 64), make([]byte, 64)
	// replied: a read that returns at once, the reply or nothing yet.
	replied := func() bool {
		var n int
		raw.Read(func(fd uintptr) bool {
			n, _, _ = unix.Recvfrom(int(fd), echo, unix.MSG_DONTWAIT)
			return true
		})
		return n > 0
	}
	send := func(seq uint32) {
		binary.BigEndian.PutUint32(msg, seq)
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	seq := uint32(0)
	for deadline := time.Now().Add(scaled(10 * time.Second)); ; seq++ {
		send(seq)
		if seq < blastEcho {
			continue
		}
		if replied() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("udp blast: no reply to datagram %d after %d datagrams", blastEcho, seq+1)
		}
	}
	for range n {
		seq++
		send(seq)
	}
	send(last)
	r := <-done
	return r[0], r[1]
}

// TestBypassCrossNodePMTU: pods with MTU 1500 over a smaller hop between
// nodes (host-gw: a 1400 underlay; VXLAN: the 1450 overlay device). A
// too-big packet of an admitted flow is left to the kernel path, counted,
// and the node's ICMP frag-needed / packet-too-big reaches the sender; TCP
// learns the path MTU and is bypassed byte-exact.
func TestBypassCrossNodePMTU(t *testing.T) {
	for _, c := range []struct {
		mode     multinode.Mode
		name     string
		underlay int
		pathMTU  int
	}{{multinode.HostGW, "xbph", 1400, 1400}, {multinode.VXLAN, "xbpv", 1500, 1450}} {
		t.Run(string(c.mode), func(t *testing.T) {
			l := newMultinode(t, multinode.Options{Name: c.name, Nodes: 2, Mode: c.mode, UnderlayMTU: c.underlay, PodMTU: 1500})
			n1, n2 := l.Node(1), l.Node(2)
			a, b, b2 := mnPod(t, n1, "a"), mnPod(t, n2, "b"), mnPod(t, n2, "b2")
			for _, n := range []*multinode.Node{n1, n2} {
				setBeLiberal(t, n, "1")
			}
			bp1, bp2 := attachBypass(t, n1, bypass.Config{}), attachBypass(t, n2, bypass.Config{})
			attachUplinks(t, l, n1, bp1)
			attachUplinks(t, l, n2, bp2)
			h, err := a.Handle()
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			pathMTU := func(dst netip.Addr) int {
				rs, err := h.RouteGet(dst.AsSlice())
				if err != nil || len(rs) == 0 {
					t.Fatalf("route to %s in %s: %v", dst, a.NetNS, err)
				}
				return rs[0].MTU
			}
			for _, v6 := range []bool{false, true} {
				t.Run("udp-"+family(v6), func(t *testing.T) {
					before := bpCounters(t, bp1)
					checkUDPTooBig(t, a, b, v6)
					d := bpDelta(before, bpCounters(t, bp1))
					t.Logf("n1: %v", d)
					if d["fallback_too_big"] == 0 || d["bypassed_out_packets"] == 0 {
						t.Errorf("%s: %v, want the small datagrams bypassed and the big one a too_big fallback", family(v6), d)
					}
					if m := pathMTU(b.Addr(v6)); m != c.pathMTU {
						t.Errorf("%s: path MTU to %s learnt as %d, want %d", family(v6), b.Addr(v6), m, c.pathMTU)
					}
				})
				t.Run("tcp-"+family(v6), func(t *testing.T) {
					dSrc, dDst, _ := xnodeTransfer(t, a, b2, bp1, bp2, v6)
					t.Logf("n1: %v; n2: %v", dSrc, dDst)
					if dSrc["fallback_too_big"] == 0 || dSrc["bypassed_out_bytes"] < mnTransfer/2 || dDst["bypassed_in_bytes"] < mnTransfer/2 {
						t.Errorf("%s: n1 %v, n2 %v: want too_big fallbacks before the path MTU was learnt, then the transfer bypassed", family(v6), dSrc, dDst)
					}
					if m := pathMTU(b2.Addr(v6)); m != c.pathMTU {
						t.Errorf("%s: path MTU to %s learnt as %d, want %d", family(v6), b2.Addr(v6), m, c.pathMTU)
					}
				})
			}
		})
	}
}

// checkUDPTooBig: small datagrams src -> dst set the flow up and are
// echoed, then one of 1500 bytes (IP) with DF: it must not arrive (the hop
// is smaller) and the sender must learn the path MTU, and a small one
// after it still arrives.
func checkUDPTooBig(t *testing.T, src, dst *multinode.Pod, v6 bool) {
	t.Helper()
	pc := listenUDPIn(t, dst, v6)
	defer pc.Close()
	sizes := make(chan int, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			k, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			sizes <- k
			pc.WriteTo(buf[:min(k, 64)], a)
		}
	}()
	c, err := dialFrom(src, "udp", netip.MustParseAddrPort(pc.LocalAddr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	level, opt, val := unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO
	payload := 1500 - 20 - 8
	if v6 {
		level, opt, val = unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO
		payload = 1500 - 40 - 8
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, val) }); err != nil || serr != nil {
		t.Fatalf("DF: %v %v", err, serr)
	}
	buf := make([]byte, 4096)
	echo := func(i int) {
		t.Helper()
		if _, err := c.Write(fmt.Appendf(nil, "small %d", i)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sizes:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: small datagram %d never arrived", family(v6), i)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("%s: echo of small datagram %d: %v", family(v6), i, err)
		}
	}
	for i := 0; i < 5; i++ {
		echo(i)
	}
	// It fits the pod's MTU: EMSGSIZE can only come from the node's ICMP
	// error, reported on the connected socket (on this very send when the
	// whole path ran within it), or from the path MTU it taught.
	learnt := false
	if _, err := c.Write(make([]byte, payload)); err != nil {
		if !errors.Is(err, syscall.EMSGSIZE) {
			t.Fatalf("%s: big datagram: %v", family(v6), err)
		}
		learnt = true
	}
	select {
	case k := <-sizes:
		t.Fatalf("%s: a %d-byte datagram crossed a smaller hop with DF", family(v6), k)
	case <-time.After(500 * time.Millisecond):
	}
	deadline := time.Now().Add(5 * time.Second)
	for !learnt {
		_, err := c.Write(make([]byte, payload))
		if err != nil {
			if !errors.Is(err, syscall.EMSGSIZE) {
				t.Fatalf("%s: big datagram after the ICMP error: %v, want EMSGSIZE", family(v6), err)
			}
			learnt = true
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the sender never learnt the path MTU", family(v6))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for len(sizes) > 0 {
		<-sizes
	}
	// A pending ICMP error would fail the next send: read it off.
	rc.Control(func(fd uintptr) { unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR) })
	echo(5)
}

// checkNoNeighbour: an established, bypassed flow whose next hop (the other
// node on the underlay) loses its neighbour entry on the sender's node goes
// on by bpf_redirect_neigh, which resolves it again.
func checkNoNeighbour(t *testing.T, bp *bypass.Bypass, n, peer *multinode.Node, src, dst *multinode.Pod, v6 bool) {
	t.Helper()
	ln := listenIn(t, dst.Do, "tcp", dst.Addr(v6))
	serve(ln, func(c net.Conn) { io.Copy(c, c) })
	c, err := dialFrom(src, "tcp", netip.MustParseAddrPort(ln.Addr().String()), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func(msg string) {
		t.Helper()
		c.SetDeadline(time.Now().Add(scaled(10 * time.Second)))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
			t.Fatalf("%s echo %q: %q %v", family(v6), msg, buf, err)
		}
	}
	echo("set up")
	echo("bypassed")
	h, err := n.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	up, err := h.LinkByName(n.Uplink)
	if err != nil {
		t.Fatal(err)
	}
	gw, fam := peer.UnderlayV4, unix.AF_INET
	if v6 {
		gw, fam = peer.UnderlayV6, unix.AF_INET6
	}
	// The next packet after the delete and its notification's read takes
	// bpf_redirect_neigh. Not waited out beyond the read (awaitRoutingRead
	// with settle): meanwhile the entry may come back (the peer's ARP or
	// neighbour solicitation). Left: a notification read between the
	// generation's read and the delete moves it too, and a packet recorded
	// then goes on by the old MAC, still the right one; so up to three
	// tries.
	var d bypass.Counters
	for try := 1; try <= 3; try++ {
		gen := bp.FlowsGeneration()
		err := h.NeighDel(&netlink.Neigh{LinkIndex: up.Attrs().Index, Family: fam, IP: gw.AsSlice()})
		if err != nil && !errors.Is(err, unix.ENOENT) {
			t.Fatalf("delete neighbour %s on %s: %v", gw, n.Uplink, err)
		}
		awaitRoutingRead(t, bp, gen, "neighbour deleted", false)
		before := bpCounters(t, bp)
		echo("after the neighbour was deleted")
		d = bpDelta(before, bpCounters(t, bp))
		t.Logf("%s, try %d: %v", family(v6), try, d)
		if d["bypassed_out_neigh_packets"] != 0 {
			return
		}
	}
	t.Errorf("%s: no packet went by bpf_redirect_neigh in 3 tries: %v", family(v6), d)
}

// checkPolicyRoute: an ip rule on the sender's node sends an established,
// bypassed flow to a table whose route to dst is unreachable. The bypass's
// FIB lookup follows the rule (fib_unreachable) and leaves the packets to
// the kernel, which does not deliver them; without the rule the flow goes
// on, bypassed again.
func checkPolicyRoute(t *testing.T, bp *bypass.Bypass, n *multinode.Node, src, dst *multinode.Pod, v6 bool) {
	t.Helper()
	c, echo := echoConn(t, src, dst, v6)
	defer c.Close() // before the next check: its late packets would count there
	what := fmt.Sprintf("%s %s -> %s", family(v6), src.Name, dst.Name)
	for _, m := range []string{"set up", "bypassed"} {
		if err := echo(m, 10*time.Second); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	h, err := n.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	fam, bits := unix.AF_INET, 32
	if v6 {
		fam, bits = unix.AF_INET6, 128
	}
	const table = 100
	rule := netlink.NewRule()
	rule.Family, rule.Priority, rule.Table = fam, 100, table
	rule.Src = prefixIPNet(netip.PrefixFrom(src.Addr(v6), bits))
	rt := &netlink.Route{Dst: prefixIPNet(netip.PrefixFrom(dst.Addr(v6), bits)), Table: table, Type: unix.RTN_UNREACHABLE}
	if err := h.RouteAdd(rt); err != nil {
		t.Fatalf("unreachable route in table %d: %v", table, err)
	}
	defer h.RouteDel(rt)
	gen := bp.FlowsGeneration()
	if err := h.RuleAdd(rule); err != nil {
		t.Fatalf("ip rule from %s lookup %d: %v", rule.Src, table, err)
	}
	awaitRoutingRead(t, bp, gen, "ip rule added", true)
	ruleOn := true
	defer func() {
		if ruleOn {
			h.RuleDel(rule)
		}
	}()
	before := bpCounters(t, bp)
	err = echo("while the rule holds", time.Second)
	d := bpDelta(before, bpCounters(t, bp))
	t.Logf("%s with the rule: %v; %v", what, err, d)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("%s: echo with an unreachable policy route: %v, want a timeout", what, err)
	}
	if d["fallback_fib_unreachable"] == 0 || d["bypassed_out_packets"] != 0 {
		t.Errorf("%s: with the rule: %v, want fib_unreachable fallbacks and nothing bypassed out", what, d)
	}
	if err := h.RuleDel(rule); err != nil {
		t.Fatal(err)
	}
	ruleOn = false
	// The retransmission of the lost segment, then more data.
	c.SetDeadline(time.Now().Add(15 * time.Second))
	buf := make([]byte, len("while the rule holds"))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("%s: after the rule went: %v", what, err)
	}
	before = bpCounters(t, bp)
	if err := echo("rule gone", 10*time.Second); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if d := bpDelta(before, bpCounters(t, bp)); d["bypassed_out_packets"] == 0 {
		t.Errorf("%s: not bypassed again after the rule went: %v", what, d)
	}
}

// awaitRoutingRead: after a change of the node's routing made when bp's
// flow cache had generation gen, bp's rtnetlink watch read a notification
// (the generation moved). With settle, also no record made before the
// change is left: the move alone does not prove that, since a notification
// read between the generation's read and the change (an earlier route's,
// a neighbour's) moves it too, and a packet (a delayed ACK) could be
// recorded then. Each record ends bp.Recheck() after it was made
// (monotonic clock), so after twice that only records made after the
// change remain. Not a timing assertion: 10 s bounds a broken watch.
func awaitRoutingRead(t *testing.T, bp *bypass.Bypass, gen uint32, what string, settle bool) {
	t.Helper()
	for deadline := time.Now().Add(scaled(10 * time.Second)); bp.FlowsGeneration() == gen; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the bypass did not read the routing notification (flow cache generation still %d)", what, gen)
		}
	}
	if settle {
		time.Sleep(2 * bp.Recheck())
	}
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// checkFragmentsAndOptions: on a UDP flow the bypass carries, datagrams
// the sender fragments (larger than the pod MTU, DF off) and, IPv4, with IP
// options take the kernel path, counted, and arrive whole.
func checkFragmentsAndOptions(t *testing.T, bpSrc, bpDst *bypass.Bypass, src, dst *multinode.Pod, v6 bool) {
	t.Helper()
	pc := listenUDPIn(t, dst, v6)
	defer pc.Close()
	go workload.ServeUDPEcho(pc)
	c, err := dialFrom(src, "udp", netip.MustParseAddrPort(pc.LocalAddr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8192)
	echo := func(msg []byte) {
		t.Helper()
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := c.Read(buf)
		if err != nil || string(buf[:k]) != string(msg) {
			t.Fatalf("%s: echo of a %d-byte datagram: %d bytes, %v", family(v6), len(msg), k, err)
		}
	}
	for i := 0; i < 3; i++ {
		echo([]byte("set up"))
	}
	level, opt, val := unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DONT
	if v6 {
		level, opt, val = unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DONT
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, val) }); err != nil || serr != nil {
		t.Fatalf("DF off: %v %v", err, serr)
	}
	before, beforeDst := bpCounters(t, bpSrc), bpCounters(t, bpDst)
	big := []byte(strings.Repeat("f", 4000))
	for i := 0; i < 3; i++ {
		echo(big)
	}
	d, dDst := bpDelta(before, bpCounters(t, bpSrc)), bpDelta(beforeDst, bpCounters(t, bpDst))
	t.Logf("%s fragments: %v; %v", family(v6), d, dDst)
	// Three fragments per datagram and direction (MTU 1500).
	if d["fallback_fragment"] < 9 || dDst["fallback_fragment"] < 9 {
		t.Errorf("%s: %d and %d fragments left to the kernel, want at least 9 on each node", family(v6), d["fallback_fragment"], dDst["fallback_fragment"])
	}
	if v6 {
		return
	}
	// Four NOPs: a 24-byte header.
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IP, unix.IP_OPTIONS, "\x01\x01\x01\x01")
	}); err != nil || serr != nil {
		t.Fatalf("IP options: %v %v", err, serr)
	}
	before = bpCounters(t, bpSrc)
	for i := 0; i < 5; i++ {
		echo([]byte("with options"))
	}
	d = bpDelta(before, bpCounters(t, bpSrc))
	t.Logf("IPv4 options: %v", d)
	if d["fallback_ip_options"] < 5 {
		t.Errorf("IPv4: %d datagrams with options left to the kernel, want 5", d["fallback_ip_options"])
	}
}
