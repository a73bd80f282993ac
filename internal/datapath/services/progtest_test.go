package services

// Program-level tests of the NodePort tc program (ez_svc_nodeport) through
// BPF_PROG_TEST_RUN, in the spirit of Cilium's bpf/tests: packets are
// crafted here, the maps are written through the load balancer's own API
// (SetNodeAddrs, SetFrontend), the real program runs, and the verdict, the
// packet it hands on, the counters and the conntrack entries it made are
// checked.
//
// The program does not rewrite packets: for a flow's first packet it
// inserts a conntrack entry carrying the NAT (DNAT to the backend, SNAT to
// the node address or none) and hands the packet on unchanged (TCX_NEXT);
// netfilter rewrites this and every later packet both ways. So "translated"
// is checked on the conntrack entry: its reply tuple is what the backend
// sends (backend -> node address, or the client for externalTrafficPolicy
// Local), i.e. conntrack's reverse translation. The kfuncs work on the
// conntrack table of the skb's network namespace (test runs: the loopback
// device of the caller's), so every case runs in a throwaway network
// namespace of its own, from a locked thread that always returns to the
// original namespace before it is unlocked.
//
// The cgroup sock_addr programs (connect4 etc.) are not tested here: Linux
// 6.18 has no BPF_PROG_TEST_RUN for BPF_PROG_TYPE_CGROUP_SOCK_ADDR (the
// syscall fails with ENOTSUPP, errno 524).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/testpacket"
)

const ptTCXNext = ^uint32(0) // TCX_NEXT (-1)

const (
	ptFIN = testpacket.TCPFin
	ptSYN = testpacket.TCPSyn
	ptRST = testpacket.TCPRst
	ptACK = testpacket.TCPAck
)

// ptNetNS is a throwaway network namespace and a conntrack netlink handle
// into it, both closed (and so the namespace and its conntrack entries
// freed) by t.Cleanup.
type ptNetNS struct {
	ns netns.NsHandle
	ct *netlink.Handle
}

func newPTNetNS(t *testing.T) *ptNetNS {
	t.Helper()
	ns, err := bpfsys.NewNetNS()
	if err != nil {
		t.Fatalf("%v (root needed)", err)
	}
	e := &ptNetNS{ns: ns}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		t.Fatal(err)
	}
	e.ct = h
	t.Cleanup(h.Close)
	return e
}

// in runs fn on a thread in the namespace (bpfsys.InNetNSHandle: it goes
// back before it is unlocked, or the runtime discards it).
func (e *ptNetNS) in(fn func() error) error { return bpfsys.InNetNSHandle(e.ns, fn) }

// run runs prog once on pkt inside the namespace: its verdict and the packet it hands on.
func (e *ptNetNS) run(t *testing.T, prog *ebpf.Program, pkt []byte) (uint32, []byte) {
	t.Helper()
	var ret uint32
	opts := &ebpf.RunOptions{Data: pkt, DataOut: make([]byte, len(pkt)+256)}
	err := e.in(func() error {
		var err error
		ret, err = prog.Run(opts)
		return err
	})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret, opts.DataOut
}

// flows lists the namespace's conntrack entries (both families) as
// ptFlowString has them, sorted.
func (e *ptNetNS) flows(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		fl, err := e.ct.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			t.Fatalf("conntrack list: %v", err)
		}
		for _, f := range fl {
			out = append(out, ptFlowString(f))
		}
	}
	slices.Sort(out)
	return out
}

func ptAP(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// ptFlowString: "proto orig-src>orig-dst reply reply-src>reply-dst".
func ptFlowString(f *netlink.ConntrackFlow) string {
	p := map[uint8]string{6: "tcp", 17: "udp"}[f.Forward.Protocol]
	if p == "" {
		p = fmt.Sprintf("proto%d", f.Forward.Protocol)
	}
	return fmt.Sprintf("%s %s>%s reply %s>%s", p, ptAP(f.Forward.SrcIP, f.Forward.SrcPort), ptAP(f.Forward.DstIP, f.Forward.DstPort),
		ptAP(f.Reverse.SrcIP, f.Reverse.SrcPort), ptAP(f.Reverse.DstIP, f.Reverse.DstPort))
}

func ptFlow(proto, origSrc, origDst, replySrc, replyDst string) string {
	return fmt.Sprintf("%s %s>%s reply %s>%s", proto, netip.MustParseAddrPort(origSrc), netip.MustParseAddrPort(origDst),
		netip.MustParseAddrPort(replySrc), netip.MustParseAddrPort(replyDst))
}

// ptAnyPortNot40000, appended to a ptFlow whose reply destination port
// is 0, makes that port any but 40000 (ptFlowsMatch).
const ptAnyPortNot40000 = " [reply dport != 40000]"

// ptFlowsMatch: got and want are the same entries, in any order; a want
// with ptAnyPortNot40000 matches its reply destination port loosely.
func ptFlowsMatch(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	used := make([]bool, len(got))
	for _, w := range want {
		loose := strings.HasSuffix(w, ptAnyPortNot40000)
		w = strings.TrimSuffix(w, ptAnyPortNot40000)
		found := false
		for i, g := range got {
			if used[i] {
				continue
			}
			ok := g == w
			if loose {
				pre := strings.TrimSuffix(w, ":0")
				port, isPort := strings.CutPrefix(g, pre+":")
				ok = isPort && port != "40000" && port != "0" && strings.Trim(port, "0123456789") == ""
			}
			if ok {
				used[i], found = true, true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// ptPreFlow is a conntrack entry without NAT (reply = original reversed)
// in TCP state state, created over netlink before the packets run.
type ptPreFlow struct {
	src, dst string // address:port
	state    uint8  // nl.TCP_CONNTRACK_*
}

func (e *ptNetNS) create(t *testing.T, p ptPreFlow) {
	t.Helper()
	s, d := netip.MustParseAddrPort(p.src), netip.MustParseAddrPort(p.dst)
	fam := netlink.InetFamily(unix.AF_INET)
	if s.Addr().Is6() {
		fam = unix.AF_INET6
	}
	f := &netlink.ConntrackFlow{
		FamilyType: uint8(fam),
		Forward:    netlink.IPTuple{SrcIP: s.Addr().AsSlice(), DstIP: d.Addr().AsSlice(), SrcPort: s.Port(), DstPort: d.Port(), Protocol: unix.IPPROTO_TCP},
		Reverse:    netlink.IPTuple{SrcIP: d.Addr().AsSlice(), DstIP: s.Addr().AsSlice(), SrcPort: d.Port(), DstPort: s.Port(), Protocol: unix.IPPROTO_TCP},
		TimeOut:    120,
		ProtoInfo:  &netlink.ProtoInfoTCP{State: p.state},
	}
	if err := e.ct.ConntrackCreate(netlink.ConntrackTable, fam, f); err != nil {
		t.Fatalf("create conntrack entry %s>%s: %v", p.src, p.dst, err)
	}
}

// Packet crafting: Ethernet + IPv4/IPv6 + TCP/UDP/ICMP with valid checksums.

func ptTCP(sport, dport uint16, flags uint8) []byte {
	return testpacket.TCP{SrcPort: sport, DstPort: dport, Seq: 0x01020304, Flags: flags, Window: 64240}.Segment(nil)
}

func ptUDP(sport, dport uint16, payload string) []byte {
	return testpacket.UDP(sport, dport, []byte(payload))
}

// ptICMPEcho is an ICMP echo request with its checksum.
func ptICMPEcho() []byte {
	b := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1, 'p', 'i', 'n', 'g'}
	binary.BigEndian.PutUint16(b[2:], testpacket.Checksum(b))
	return b
}

var ptZeroMAC = [6]byte{} // the loopback device's address: test runs see PACKET_HOST

// ptPacket is an Ethernet frame (destination dmac) carrying an IP packet
// from src to dst with l4 (checksums filled in); frag is IPv4's flags and
// fragment offset word.
func ptPacket(dmac [6]byte, src, dst string, proto uint8, frag uint16, l4 []byte) []byte {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	l4 = testpacket.WithL4Checksum(s, d, proto, l4)
	smac := []byte{0x02, 0, 0, 0, 0, 0x02}
	if s.Is4() {
		return testpacket.Eth(dmac[:], smac, unix.ETH_P_IP,
			testpacket.IPv4{Src: src, Dst: dst, Proto: proto, TTL: 64, ID: 0x4242, Frag: frag}.Packet(l4))
	}
	return testpacket.Eth(dmac[:], smac, unix.ETH_P_IPV6, testpacket.IPv6(src, dst, 64, proto, l4))
}

// ptChecksumsValid recomputes the IPv4 header checksum and the TCP, UDP or
// ICMP checksum of frame (as ptPacket lays it out: no IPv4 options, no IPv6
// extension headers); a fragment's L4 and a non-IP frame are not checked.
func ptChecksumsValid(frame []byte) error {
	if len(frame) < 14 {
		return fmt.Errorf("%d bytes: no Ethernet header", len(frame))
	}
	var src, dst netip.Addr
	var proto uint8
	var l4 []byte
	switch binary.BigEndian.Uint16(frame[12:]) {
	case unix.ETH_P_IP:
		ip := frame[14:]
		if len(ip) < 20 {
			return fmt.Errorf("IPv4 header cut short")
		}
		if s := testpacket.Sum(0, ip[:20]); s != 0xffff {
			return fmt.Errorf("IPv4 header checksum %#04x wrong (sum %#04x)", binary.BigEndian.Uint16(ip[10:]), s)
		}
		if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			return nil // a fragment: no whole L4 segment to check
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		proto, l4 = ip[9], ip[20:]
	case unix.ETH_P_IPV6:
		ip := frame[14:]
		if len(ip) < 40 {
			return fmt.Errorf("IPv6 header cut short")
		}
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		proto, l4 = ip[6], ip[40:]
	default:
		return nil // not IP (ARP): no checksum to check
	}
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
		if s := testpacket.Sum(testpacket.PseudoSum(src, dst, proto, len(l4)), l4); s != 0xffff {
			return fmt.Errorf("proto %d checksum %#04x wrong (sum %#04x)", proto, binary.BigEndian.Uint16(l4[testpacket.L4ChecksumOffset(proto):]), s)
		}
	case unix.IPPROTO_ICMP:
		if s := testpacket.Sum(0, l4); s != 0xffff {
			return fmt.Errorf("ICMP checksum wrong (sum %#04x)", s)
		}
	}
	return nil
}

// ptCounterDelta is after - before for every counter with a change.
func ptCounterDelta(before, after Counters) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func ptFormatCounters(m map[string]uint64) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

// The node, its NodePorts and their backends, as TestNodePortProgram
// writes them.
const (
	ptNode4    = "10.250.1.1"
	ptNode6    = "fd50::1"
	ptClient4  = "10.250.1.2"
	ptClient6  = "fd50::2"
	ptTCPBe4   = "10.244.0.2:8080"
	ptUDPBe4   = "10.244.0.3:5353"
	ptLocalBe4 = "10.244.0.4:8080"
	ptTCPBe6   = "[fd44::2]:8080"
	ptUDPBe6   = "[fd44::3]:5353"
)

// ptLB loads a load balancer with NodePorts on 10.250.1.1 and fd50::1:
//
//	TCP 30080 (v4, v6) -> one backend each (Cluster: SNAT to the node address)
//	UDP 30053 (v4, v6) -> one backend each (Cluster)
//	TCP 30081, UDP 30054 (v4) -> no backends
//	TCP 30082 (v4) -> one backend, KeepSource (externalTrafficPolicy Local)
//	TCP 30083 (v4) -> two backends
//
// and a ClusterIP frontend 10.96.0.10:30090/TCP (not a NodePort).
func ptLB(t *testing.T) *LB {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("program tests load eBPF programs and create network namespaces: run go test as root")
	}
	lb, err := Load(Config{MaxFrontends: 64, MaxBackends: 64, MaxSlots: 256})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lb.Close() })
	if lb.objs.EzSvcNodeport == nil {
		st, _ := lb.Parts().Get(parts.NodePort)
		t.Fatalf("the NodePort program did not load on this kernel: %+v", st)
	}
	if err := lb.SetNodeAddrs([]netip.Addr{netip.MustParseAddr(ptNode4), netip.MustParseAddr(ptNode6)}); err != nil {
		t.Fatal(err)
	}
	any4, any6 := netip.IPv4Unspecified(), netip.IPv6Unspecified()
	be := func(s ...string) []Backend {
		var out []Backend
		for _, x := range s {
			out = append(out, netip.MustParseAddrPort(x))
		}
		return out
	}
	for _, f := range []struct {
		fe Frontend
		tg Target
	}{
		{Frontend{Addr: any4, Port: 30080, Proto: TCP, NodePort: true}, Target{Backends: be(ptTCPBe4)}},
		{Frontend{Addr: any6, Port: 30080, Proto: TCP, NodePort: true}, Target{Backends: be(ptTCPBe6)}},
		{Frontend{Addr: any4, Port: 30053, Proto: UDP, NodePort: true}, Target{Backends: be(ptUDPBe4)}},
		{Frontend{Addr: any6, Port: 30053, Proto: UDP, NodePort: true}, Target{Backends: be(ptUDPBe6)}},
		{Frontend{Addr: any4, Port: 30081, Proto: TCP, NodePort: true}, Target{}},
		{Frontend{Addr: any4, Port: 30054, Proto: UDP, NodePort: true}, Target{}},
		{Frontend{Addr: any4, Port: 30082, Proto: TCP, NodePort: true}, Target{Backends: be(ptLocalBe4), KeepSource: true}},
		{Frontend{Addr: any4, Port: 30083, Proto: TCP, NodePort: true}, Target{Backends: be("10.244.0.5:8080", "10.244.0.6:8080")}},
		{Frontend{Addr: any4, Port: 30084, Proto: TCP, NodePort: true}, Target{Backends: be("10.244.0.5:8080", "10.244.0.6:8080", "10.244.0.7:8080")}},
		{Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 30090, Proto: TCP}, Target{Backends: be(ptTCPBe4)}},
	} {
		if err := lb.SetFrontend(f.fe, f.tg); err != nil {
			t.Fatal(err)
		}
	}
	return lb
}

// ptRunAll runs the packets in order in e: each must be handed on
// unchanged (TCX_NEXT, same bytes, checksums valid).
func ptRunAll(t *testing.T, lb *LB, e *ptNetNS, pkts [][]byte) {
	t.Helper()
	for i, pkt := range pkts {
		if err := ptChecksumsValid(pkt); err != nil {
			t.Fatalf("packet %d as crafted: %v", i, err) // the test's own packet
		}
		ret, out := e.run(t, lb.objs.EzSvcNodeport, pkt)
		if ret != ptTCXNext {
			t.Errorf("packet %d: verdict %d, want TCX_NEXT (-1)", i, int32(ret))
		}
		if !bytes.Equal(out, pkt) {
			t.Errorf("packet %d changed by the program:\n got %x\nwant %x", i, out, pkt)
		}
		if err := ptChecksumsValid(out); err != nil {
			t.Errorf("packet %d handed on: %v", i, err)
		}
	}
}

// TestNodePortProgram runs ez_svc_nodeport on crafted packets, each case
// in a fresh network namespace (empty conntrack table, save the case's
// pre-existing entries): the verdict is always TCX_NEXT with the packet
// unchanged, and the counters that moved and the conntrack entries left
// are exactly the case's.
func TestNodePortProgram(t *testing.T) {
	lb := ptLB(t)
	mac := ptZeroMAC
	tcp4 := func(src, dst string, sport, dport uint16, flags uint8) []byte {
		return ptPacket(mac, src, dst, unix.IPPROTO_TCP, 0, ptTCP(sport, dport, flags))
	}
	udp := func(src, dst string, sport, dport uint16) []byte {
		return ptPacket(mac, src, dst, unix.IPPROTO_UDP, 0, ptUDP(sport, dport, "query"))
	}
	c4, n4, c6, n6 := ptClient4, ptNode4, ptClient6, ptNode6
	cases := []struct {
		name     string
		pre      []ptPreFlow
		pkts     [][]byte
		counters map[string]uint64 // counters that move, by how much; all others stay
		flows    []string          // the conntrack table after, exactly (ptFlowsMatch)
	}{{
		name:     "tcp4 SYN to a NodePort: entry DNAT to the backend, SNAT to the node address",
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("tcp", c4+":40000", n4+":30080", ptTCPBe4, n4+":40000")},
	}, {
		name:     "udp4 to a NodePort: entry DNAT to the backend, SNAT to the node address",
		pkts:     [][]byte{udp(c4, n4, 40000, 30053)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("udp", c4+":40000", n4+":30053", ptUDPBe4, n4+":40000")},
	}, {
		name:     "tcp6 SYN to a NodePort",
		pkts:     [][]byte{tcp4(c6, n6, 40000, 30080, ptSYN)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("tcp", "["+c6+"]:40000", "["+n6+"]:30080", ptTCPBe6, "["+n6+"]:40000")},
	}, {
		name:     "udp6 to a NodePort",
		pkts:     [][]byte{udp(c6, n6, 40000, 30053)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("udp", "["+c6+"]:40000", "["+n6+"]:30053", ptUDPBe6, "["+n6+"]:40000")},
	}, {
		name:     "externalTrafficPolicy Local: DNAT only, the backend replies to the client",
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30082, ptSYN)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("tcp", c4+":40000", n4+":30082", ptLocalBe4, c4+":40000")},
	}, {
		name: "flow's later packets (retransmitted SYN, ACK) and the backend's SYN-ACK: left to conntrack",
		pkts: [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN), tcp4(c4, n4, 40000, 30080, ptSYN), tcp4(c4, n4, 40000, 30080, ptACK),
			tcp4("10.244.0.2", n4, 8080, 40000, ptSYN|ptACK)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("tcp", c4+":40000", n4+":30080", ptTCPBe4, n4+":40000")},
	}, {
		name:     "udp4 flow's second datagram and the backend's reply: left to conntrack",
		pkts:     [][]byte{udp(c4, n4, 40000, 30053), udp(c4, n4, 40000, 30053), udp("10.244.0.3", n4, 5353, 40000)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("udp", c4+":40000", n4+":30053", ptUDPBe4, n4+":40000")},
	}, {
		// The reply (after SNAT) goes to node:30080, itself a NodePort:
		// conntrack finds it as the entry's reply direction, no new flow.
		name:     "backend's SYN-ACK to a client port that is a NodePort: the entry's reply, left alone",
		pkts:     [][]byte{tcp4(c4, n4, 30080, 30080, ptSYN), tcp4("10.244.0.2", n4, 8080, 30080, ptSYN|ptACK)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("tcp", c4+":30080", n4+":30080", ptTCPBe4, n4+":30080")},
	}, {
		name:     "backend's UDP reply to a client port that is a NodePort: the entry's reply, no second flow",
		pkts:     [][]byte{udp(c4, n4, 30053, 30053), udp("10.244.0.3", n4, 5353, 30053)},
		counters: map[string]uint64{"nodeport_new": 1},
		flows:    []string{ptFlow("udp", c4+":30053", n4+":30053", ptUDPBe4, n4+":30053")},
	}, {
		name:     "two clients, two flows: one entry each",
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN), tcp4("10.250.1.3", n4, 40001, 30080, ptSYN), udp(c4, n4, 40000, 30053)},
		counters: map[string]uint64{"nodeport_new": 3},
		flows: []string{ptFlow("tcp", c4+":40000", n4+":30080", ptTCPBe4, n4+":40000"),
			ptFlow("tcp", "10.250.1.3:40001", n4+":30080", ptTCPBe4, n4+":40001"),
			ptFlow("udp", c4+":40000", n4+":30053", ptUDPBe4, n4+":40000")},
	}, {
		// Masqueraded to one node address, both would have the reply
		// tuple backend -> node:40000: nf_nat gives the second another
		// source port (the program's port -1), else the insert would fail.
		name:     "two clients on the same port: the second is masqueraded to another port",
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN), tcp4("10.250.1.3", n4, 40000, 30080, ptSYN)},
		counters: map[string]uint64{"nodeport_new": 2},
		flows: []string{ptFlow("tcp", c4+":40000", n4+":30080", ptTCPBe4, n4+":40000"),
			ptFlow("tcp", "10.250.1.3:40000", n4+":30080", ptTCPBe4, n4+":0") + ptAnyPortNot40000},
	}, {
		name:     "ACK of no known flow: not_new, no entry",
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30080, ptACK)},
		counters: map[string]uint64{"nodeport_not_new": 1},
	}, {
		name:     "SYN-ACK, RST, FIN of no known flow: not_new each",
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN|ptACK), tcp4(c4, n4, 40001, 30080, ptSYN|ptRST), tcp4(c4, n4, 40002, 30080, ptFIN)},
		counters: map[string]uint64{"nodeport_not_new": 3},
	}, {
		name:     "TCP NodePort without backends: no_backend, no entry",
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30081, ptSYN)},
		counters: map[string]uint64{"nodeport_no_backend": 1},
	}, {
		name:     "UDP NodePort without backends: no_backend, no entry",
		pkts:     [][]byte{udp(c4, n4, 40000, 30054)},
		counters: map[string]uint64{"nodeport_no_backend": 1},
	}, {
		name: "not a NodePort: other port, a ClusterIP frontend's port, UDP to a TCP NodePort, IPv6 to an IPv4-only NodePort",
		pkts: [][]byte{tcp4(c4, n4, 40000, 31000, ptSYN), tcp4(c4, n4, 40000, 30090, ptSYN), udp(c4, n4, 40000, 30080),
			tcp4(c6, n6, 40000, 30082, ptSYN)},
	}, {
		name: "NodePort on an address not the node's (v4, v6, the ClusterIP)",
		pkts: [][]byte{tcp4(c4, "10.250.1.9", 40000, 30080, ptSYN), tcp4(c6, "fd50::9", 40000, 30080, ptSYN),
			tcp4(c4, "10.96.0.10", 40000, 30080, ptSYN)},
	}, {
		name: "other protocols, a later fragment, ARP, a frame for another host",
		pkts: [][]byte{
			ptPacket(mac, c4, n4, unix.IPPROTO_ICMP, 0, ptICMPEcho()),
			ptPacket(mac, c4, n4, unix.IPPROTO_SCTP, 0, ptTCP(40000, 30080, 0)), // ports where SCTP has them
			ptPacket(mac, c4, n4, unix.IPPROTO_TCP, 185, ptTCP(40000, 30080, ptSYN)),
			ptARP(),
			ptPacket([6]byte{0x02, 0, 0, 0, 0, 0x01}, c4, n4, unix.IPPROTO_TCP, 0, ptTCP(40000, 30080, ptSYN)),
		},
	}, {
		// A client reusing the port of a closed flow: its entry is expired
		// and the flow set up anew with the NAT.
		name:     "SYN on a TIME_WAIT entry's tuple: reopened with the NAT",
		pre:      []ptPreFlow{{src: c4 + ":40000", dst: n4 + ":30080", state: nl.TCP_CONNTRACK_TIME_WAIT}},
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN)},
		counters: map[string]uint64{"nodeport_reopened": 1, "nodeport_new": 1},
		flows:    []string{ptFlow("tcp", c4+":40000", n4+":30080", ptTCPBe4, n4+":40000")},
	}, {
		name:     "SYN on a CLOSE entry's tuple: reopened with the NAT",
		pre:      []ptPreFlow{{src: c4 + ":40000", dst: n4 + ":30080", state: nl.TCP_CONNTRACK_CLOSE}},
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN)},
		counters: map[string]uint64{"nodeport_reopened": 1, "nodeport_new": 1},
		flows:    []string{ptFlow("tcp", c4+":40000", n4+":30080", ptTCPBe4, n4+":40000")},
	}, {
		// The closed flow's entry goes even though no new one is made:
		// the kernel path then sets the flow up as conntrack's own reopen would.
		name:     "SYN on a TIME_WAIT entry's tuple to a NodePort without backends: expired, no_backend",
		pre:      []ptPreFlow{{src: c4 + ":40000", dst: n4 + ":30081", state: nl.TCP_CONNTRACK_TIME_WAIT}},
		pkts:     [][]byte{tcp4(c4, n4, 40000, 30081, ptSYN)},
		counters: map[string]uint64{"nodeport_reopened": 1, "nodeport_no_backend": 1},
	}, {
		name:  "ACK on a TIME_WAIT entry's tuple: not a reopening, left alone",
		pre:   []ptPreFlow{{src: c4 + ":40000", dst: n4 + ":30080", state: nl.TCP_CONNTRACK_TIME_WAIT}},
		pkts:  [][]byte{tcp4(c4, n4, 40000, 30080, ptACK)},
		flows: []string{ptFlow("tcp", c4+":40000", n4+":30080", n4+":30080", c4+":40000")},
	}, {
		name:  "SYN on an ESTABLISHED entry's tuple: the kernel's flow, left alone",
		pre:   []ptPreFlow{{src: c4 + ":40000", dst: n4 + ":30080", state: nl.TCP_CONNTRACK_ESTABLISHED}},
		pkts:  [][]byte{tcp4(c4, n4, 40000, 30080, ptSYN)},
		flows: []string{ptFlow("tcp", c4+":40000", n4+":30080", n4+":30080", c4+":40000")},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newPTNetNS(t)
			for _, p := range tc.pre {
				e.create(t, p)
			}
			before, err := lb.Counters()
			if err != nil {
				t.Fatal(err)
			}
			ptRunAll(t, lb, e, tc.pkts)
			after, err := lb.Counters()
			if err != nil {
				t.Fatal(err)
			}
			want := tc.counters
			if want == nil {
				want = map[string]uint64{}
			}
			if got := ptCounterDelta(before, after); ptFormatCounters(got) != ptFormatCounters(want) {
				t.Errorf("counters moved %s, want %s", ptFormatCounters(got), ptFormatCounters(want))
			}
			if got := e.flows(t); !ptFlowsMatch(got, tc.flows) {
				t.Errorf("conntrack entries:\n got %q\nwant %q", got, tc.flows)
			}
		})
	}
}

// ptARP is an ARP request (ethertype 0x0806) for the node address.
func ptARP() []byte {
	b := make([]byte, 14+28)
	copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 0x02})
	binary.BigEndian.PutUint16(b[12:], unix.ETH_P_ARP)
	a := b[14:]
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], unix.ETH_P_IP)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1)
	copy(a[14:], []byte{10, 250, 1, 2})
	copy(a[24:], []byte{10, 250, 1, 1})
	return b
}

// TestNodePortProgramChoosesEveryBackend: flows to a NodePort get one of
// its backends each, and over 96 flows every one: with two backends,
// carried in the NodePort's value (EZ_SVC_INLINE), and with three, chosen
// by slot (a bias away from one would fail with probability below 2^-50).
func TestNodePortProgramChoosesEveryBackend(t *testing.T) {
	for _, tc := range []struct {
		port     uint16
		backends []string
	}{
		{30083, []string{"10.244.0.5:8080", "10.244.0.6:8080"}},
		{30084, []string{"10.244.0.5:8080", "10.244.0.6:8080", "10.244.0.7:8080"}},
	} {
		t.Run(fmt.Sprintf("%d backends", len(tc.backends)), func(t *testing.T) {
			lb := ptLB(t)
			e := newPTNetNS(t)
			before, err := lb.Counters()
			if err != nil {
				t.Fatal(err)
			}
			const flows = 96
			var pkts [][]byte
			for i := range flows {
				pkts = append(pkts, ptPacket(ptZeroMAC, ptClient4, ptNode4, unix.IPPROTO_TCP, 0, ptTCP(uint16(41000+i), tc.port, ptSYN)))
			}
			ptRunAll(t, lb, e, pkts)
			after, err := lb.Counters()
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]uint64{"nodeport_new": flows}
			if got := ptCounterDelta(before, after); ptFormatCounters(got) != ptFormatCounters(want) {
				t.Errorf("counters moved %s, want %s", ptFormatCounters(got), ptFormatCounters(want))
			}
			seen := map[string]int{}
			got := e.flows(t)
			if len(got) != flows {
				t.Fatalf("%d conntrack entries, want %d: %q", len(got), flows, got)
			}
			for i := range flows {
				var hit string
				for _, b := range tc.backends {
					w := ptFlow("tcp", fmt.Sprintf("%s:%d", ptClient4, 41000+i), fmt.Sprintf("%s:%d", ptNode4, tc.port), b, fmt.Sprintf("%s:%d", ptNode4, 41000+i))
					if slices.Contains(got, w) {
						hit = b
					}
				}
				if hit == "" {
					t.Errorf("client port %d: no entry to any backend in %q", 41000+i, got)
					continue
				}
				seen[hit]++
			}
			if len(seen) != len(tc.backends) {
				t.Errorf("backends chosen %v: want all of %v", seen, tc.backends)
			}
		})
	}
}

// TestProgTestHelpers: the checks TestNodePortProgram relies on reject
// what they must: a packet with any checksummed byte flipped, and a
// conntrack listing that differs from the one wanted.
func TestProgTestHelpers(t *testing.T) {
	for _, tc := range []struct {
		name string
		pkt  []byte
		flip []int // offsets (from the Ethernet header) each of which, flipped, must fail
	}{
		{"tcp4", ptPacket(ptZeroMAC, ptClient4, ptNode4, unix.IPPROTO_TCP, 0, ptTCP(40000, 30080, ptSYN)), []int{14 + 10, 14 + 12, 14 + 19, 34 + 2, 34 + 16, 34 + 19}},
		{"udp4", ptPacket(ptZeroMAC, ptClient4, ptNode4, unix.IPPROTO_UDP, 0, ptUDP(40000, 30053, "query")), []int{14 + 16, 34 + 3, 34 + 6, 34 + 12}},
		{"tcp6", ptPacket(ptZeroMAC, ptClient6, ptNode6, unix.IPPROTO_TCP, 0, ptTCP(40000, 30080, ptSYN)), []int{14 + 8, 14 + 39, 54 + 3, 54 + 13}},
		{"udp6", ptPacket(ptZeroMAC, ptClient6, ptNode6, unix.IPPROTO_UDP, 0, ptUDP(40000, 30053, "query")), []int{14 + 24, 54 + 1, 54 + 7, 54 + 8}},
		{"icmp4", ptPacket(ptZeroMAC, ptClient4, ptNode4, unix.IPPROTO_ICMP, 0, ptICMPEcho()), []int{34 + 0, 34 + 5, 34 + 11}},
	} {
		if err := ptChecksumsValid(tc.pkt); err != nil {
			t.Errorf("%s as crafted: %v", tc.name, err)
		}
		for _, off := range tc.flip {
			p := slices.Clone(tc.pkt)
			p[off] ^= 0x40
			if ptChecksumsValid(p) == nil {
				t.Errorf("%s with byte %d flipped: checksums pass", tc.name, off)
			}
		}
	}
	a := ptFlow("tcp", "10.0.0.1:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.2:40000")
	b := ptFlow("tcp", "10.0.0.4:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.2:40001")
	loose := ptFlow("tcp", "10.0.0.4:1", "10.0.0.2:2", "10.0.0.3:3", "10.0.0.2:0") + ptAnyPortNot40000
	for _, tc := range []struct {
		got, want []string
		match     bool
	}{
		{[]string{a, b}, []string{b, a}, true},
		{[]string{a, b}, []string{a, loose}, true},
		{[]string{a}, []string{a, b}, false},
		{[]string{a, b}, []string{a}, false},
		{[]string{a, a}, []string{a, b}, false},
		{[]string{a, strings.Replace(b, ":40001", ":40000", 1)}, []string{a, loose}, false},
		{nil, nil, true},
		{[]string{a}, nil, false},
	} {
		if got := ptFlowsMatch(tc.got, tc.want); got != tc.match {
			t.Errorf("ptFlowsMatch(%q, %q) = %v, want %v", tc.got, tc.want, got, tc.match)
		}
	}
}
