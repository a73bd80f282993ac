package bpftest

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/testpacket"
)

// objects are the unit-test programs and the maps they use; nothing else of
// the object (the egress program, the sockhash) is created.
type objects struct {
	TestParse       *ebpf.Program `ebpf:"test_parse"`
	TestKey         *ebpf.Program `ebpf:"test_key"`
	TestSelect      *ebpf.Program `ebpf:"test_select"`
	TestUnreadBound *ebpf.Program `ebpf:"test_unread_bound"`
	BoundIO         *ebpf.Map     `ebpf:"test_bound_io"`
	ParseOut        *ebpf.Map     `ebpf:"test_parse_out"`
	KeyIn           *ebpf.Map     `ebpf:"test_key_in"`
	KeyOut          *ebpf.Map     `ebpf:"test_key_out"`
	PortRules       *ebpf.Map     `ebpf:"ez_sc_port_rules"`
	CIDRRules       *ebpf.Map     `ebpf:"ez_sc_cidr_rules"`
}

// load loads the programs with the selection flags (enum ez_cfg_flag) set.
func load(t *testing.T, cfgFlags unitsEzCfgFlag) *objects {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("eBPF unit tests load programs and need root: run go test as root")
	}
	spec, err := loadUnits()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables[unitsVarEzCfgFlags].Set(uint32(cfgFlags)); err != nil {
		t.Fatal(err)
	}
	var o objects
	if err := spec.LoadAndAssign(&o, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("load: %+v", ve)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range []interface{ Close() error }{o.TestParse, o.TestKey, o.TestSelect, o.TestUnreadBound, o.BoundIO, o.ParseOut, o.KeyIn, o.KeyOut, o.PortRules, o.CIDRRules} {
			c.Close()
		}
	})
	return &o
}

// run runs prog once on a packet (at least an Ethernet header) and returns its return value.
func run(t *testing.T, prog *ebpf.Program, pkt []byte) uint32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret
}

const (
	ethIPv4 = testpacket.EthIPv4
	ethIPv6 = testpacket.EthIPv6
	ethARP  = testpacket.EthARP
	tcpFIN  = testpacket.TCPFin
	tcpSYN  = testpacket.TCPSyn
	tcpACK  = testpacket.TCPAck
)

// The packets of these tests (testpacket): zero MACs, ports and flags
// only, no L4 checksums.
func eth(proto uint16, l3 []byte) []byte { return testpacket.Eth(nil, nil, proto, l3) }

// ipv4 is an IPv4 packet with options; totLen 0 means the real length.
func ipv4(src, dst string, proto uint8, frag uint16, opts, l4 []byte, totLen int) []byte {
	return testpacket.IPv4{Src: src, Dst: dst, Proto: proto, TTL: 64, Frag: frag, Opts: opts, TotLen: totLen}.Packet(l4)
}

func ipv6(src, dst string, next uint8, l4 []byte) []byte {
	return testpacket.IPv6(src, dst, 64, next, l4)
}

func tcp(sport, dport uint16, flags uint8, opts, payload []byte) []byte {
	return testpacket.TCP{SrcPort: sport, DstPort: dport, Flags: flags, Opts: opts}.Segment(payload)
}

func udp(sport, dport uint16, payload []byte) []byte { return testpacket.UDP(sport, dport, payload) }

// words is an address as ez_flow holds it: the header's bytes, IPv4 in word 0.
func words(a string) [4]uint32 {
	var w [4]uint32
	b := netip.MustParseAddr(a).AsSlice()
	for i := 0; i < len(b)/4; i++ {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w
}

// mapped is the 16-byte key form: IPv6, IPv4 v4-mapped.
func mapped(a string) [16]uint8 {
	return netip.MustParseAddr(a).As16()
}

func TestParse(t *testing.T) {
	o := load(t, 0)
	payload := []byte("hello")
	tcpOpts := make([]byte, 12) // doff 8
	cases := []struct {
		name    string
		pkt     []byte
		ret     int32 // of ez_parse and trc_parse
		want    unitsEzFlow
		syn     bool // parse_syn accepts it
		synAck  bool
		synLoad uint32
	}{{
		name: "ipv4 tcp syn",
		pkt:  eth(ethIPv4, ipv4("10.0.0.1", "10.0.0.2", 6, 0, nil, tcp(40000, 8080, tcpSYN, nil, nil), 0)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 20, Sport: 40000, Dport: 8080,
			Family: 4, Proto: 6, TcpFlags: tcpSYN, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS | unitsEzFlowFlagEZ_FLOW_TCP)},
		syn: true,
	}, {
		name: "ipv4 and tcp options, syn with data",
		pkt:  eth(ethIPv4, ipv4("192.168.1.1", "127.0.0.1", 6, 0, []byte{1, 1, 1, 1}, tcp(1, 65535, tcpSYN, tcpOpts, payload), 0)),
		want: unitsEzFlow{Saddr: words("192.168.1.1"), Daddr: words("127.0.0.1"), L4off: 24, Payload: 5, Sport: 1, Dport: 65535,
			Family: 4, Proto: 6, TcpFlags: tcpSYN, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS | unitsEzFlowFlagEZ_FLOW_TCP)},
		syn: true, synLoad: 5,
	}, {
		name: "ipv6 tcp syn-ack",
		pkt:  eth(ethIPv6, ipv6("fd00::1", "fd00::2", 6, tcp(443, 50000, tcpSYN|tcpACK, nil, nil))),
		want: unitsEzFlow{Saddr: words("fd00::1"), Daddr: words("fd00::2"), L4off: 40, Sport: 443, Dport: 50000,
			Family: 6, Proto: 6, TcpFlags: tcpSYN | tcpACK, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS | unitsEzFlowFlagEZ_FLOW_TCP)},
		syn: true, synAck: true,
	}, {
		name: "ipv4 tcp ack is not a syn",
		pkt:  eth(ethIPv4, ipv4("10.0.0.1", "10.0.0.2", 6, 0, nil, tcp(1000, 2000, tcpACK, nil, payload), 0)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 20, Payload: 5, Sport: 1000, Dport: 2000,
			Family: 4, Proto: 6, TcpFlags: tcpACK, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS | unitsEzFlowFlagEZ_FLOW_TCP)},
	}, {
		name: "ipv4 tcp fin",
		pkt:  eth(ethIPv4, ipv4("10.0.0.1", "10.0.0.2", 6, 0, nil, tcp(1000, 2000, tcpFIN|tcpACK, nil, nil), 0)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 20, Sport: 1000, Dport: 2000,
			Family: 4, Proto: 6, TcpFlags: tcpFIN | tcpACK, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS | unitsEzFlowFlagEZ_FLOW_TCP)},
	}, {
		name: "ipv6 tcp fin",
		pkt:  eth(ethIPv6, ipv6("fd00::1", "fd00::2", 6, tcp(443, 50000, tcpFIN|tcpACK, nil, nil))),
		want: unitsEzFlow{Saddr: words("fd00::1"), Daddr: words("fd00::2"), L4off: 40, Sport: 443, Dport: 50000,
			Family: 6, Proto: 6, TcpFlags: tcpFIN | tcpACK, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS | unitsEzFlowFlagEZ_FLOW_TCP)},
	}, {
		name: "ipv4 udp",
		pkt:  eth(ethIPv4, ipv4("10.1.2.3", "10.3.2.1", 17, 0, nil, udp(53, 5353, payload), 0)),
		want: unitsEzFlow{Saddr: words("10.1.2.3"), Daddr: words("10.3.2.1"), L4off: 20, Sport: 53, Dport: 5353,
			Family: 4, Proto: 17, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS)},
	}, {
		name: "ipv6 udp",
		pkt:  eth(ethIPv6, ipv6("::1", "::1", 17, udp(9, 10, nil))),
		want: unitsEzFlow{Saddr: words("::1"), Daddr: words("::1"), L4off: 40, Sport: 9, Dport: 10,
			Family: 6, Proto: 17, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS)},
	}, {
		name: "ipv6 extension header: ports not read",
		pkt:  eth(ethIPv6, ipv6("fd00::1", "fd00::2", 0, append([]byte{6, 0, 1, 4, 0, 0, 0, 0}, tcp(1, 2, tcpSYN, nil, nil)...))),
		want: unitsEzFlow{Saddr: words("fd00::1"), Daddr: words("fd00::2"), L4off: 40, Family: 6, Proto: 0},
	}, {
		name: "ipv4 first fragment: ports, but no syn",
		pkt:  eth(ethIPv4, ipv4("10.0.0.1", "10.0.0.2", 6, 0x2000, nil, tcp(7, 8, tcpSYN, nil, nil), 0)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 20, Sport: 7, Dport: 8, Family: 4, Proto: 6,
			TcpFlags: tcpSYN, Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS | unitsEzFlowFlagEZ_FLOW_TCP | unitsEzFlowFlagEZ_FLOW_FRAG)},
	}, {
		name: "ipv4 later fragment: no ports",
		pkt:  eth(ethIPv4, ipv4("10.0.0.1", "10.0.0.2", 6, 0x0010, nil, tcp(7, 8, tcpSYN, nil, nil), 0)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 20, Family: 4, Proto: 6,
			Flags: uint8(unitsEzFlowFlagEZ_FLOW_FRAG)},
	}, {
		name: "tcp cut after the ports",
		pkt:  eth(ethIPv4, ipv4("10.0.0.1", "10.0.0.2", 6, 0, nil, tcp(1234, 80, tcpSYN, nil, nil)[:6], 40)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 20, Sport: 1234, Dport: 80, Family: 4, Proto: 6,
			Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS)},
	}, {
		name: "tcp cut inside the ports",
		pkt:  eth(ethIPv4, ipv4("10.0.0.1", "10.0.0.2", 6, 0, nil, tcp(1234, 80, tcpSYN, nil, nil)[:3], 40)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 20, Family: 4, Proto: 6},
	}, {
		// The kernel's test run refuses an IP packet shorter than its fixed
		// header, so truncation is tested past it.
		name: "ipv4 options cut short: no ports",
		pkt:  eth(ethIPv4, append([]byte{0x4f}, ipv4("10.0.0.1", "10.0.0.2", 6, 0, nil, tcp(1, 2, tcpSYN, nil, nil), 0)[1:]...)),
		want: unitsEzFlow{Saddr: words("10.0.0.1"), Daddr: words("10.0.0.2"), L4off: 60, Family: 4, Proto: 6},
	}, {
		name: "ipv6 tcp cut inside the ports",
		pkt:  eth(ethIPv6, ipv6("fd00::1", "fd00::2", 6, []byte{0, 1, 0})),
		want: unitsEzFlow{Saddr: words("fd00::1"), Daddr: words("fd00::2"), L4off: 40, Family: 6, Proto: 6},
	}, {
		name: "ipv6 tcp cut before the flags",
		pkt:  eth(ethIPv6, ipv6("fd00::1", "fd00::2", 6, tcp(4242, 22, tcpSYN, nil, nil)[:13])),
		want: unitsEzFlow{Saddr: words("fd00::1"), Daddr: words("fd00::2"), L4off: 40, Sport: 4242, Dport: 22, Family: 6, Proto: 6,
			Flags: uint8(unitsEzFlowFlagEZ_FLOW_PORTS)},
	}, {
		name: "ethertype ipv4, version 6",
		pkt:  eth(ethIPv4, ipv6("fd00::1", "fd00::2", 6, tcp(1, 2, tcpSYN, nil, nil))),
		ret:  -1,
	}, {
		name: "ipv4 ihl below 5",
		pkt:  eth(ethIPv4, append([]byte{0x44}, ipv4("10.0.0.1", "10.0.0.2", 6, 0, nil, tcp(1, 2, tcpSYN, nil, nil), 0)[1:]...)),
		ret:  -1,
	}, {
		name: "arp",
		pkt:  eth(ethARP, make([]byte, 28)),
		ret:  -1,
	}}
	var zero uint32
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			run(t, o.TestParse, c.pkt)
			var out unitsTestParseOut
			if err := o.ParseOut.Lookup(&zero, &out); err != nil {
				t.Fatal(err)
			}
			if out.SkbRet != c.ret || out.KernRet != c.ret {
				t.Fatalf("ret: skb %d, kern %d, want %d", out.SkbRet, out.KernRet, c.ret)
			}
			if c.ret == 0 && out.Skb != c.want {
				t.Errorf("skb reader:\n got %+v\nwant %+v", out.Skb, c.want)
			}
			if c.ret == 0 && out.Kern != c.want {
				t.Errorf("kernel reader:\n got %+v\nwant %+v", out.Kern, c.want)
			}
			// ez_tcp_flags_quick agrees with ez_parse: the flags of an unfragmented
			// TCP segment, or none. A test run's packet is all linear data, so
			// "unknown" only where ez_parse could not read the flags either.
			tcpRead := c.ret == 0 && out.Skb.Flags&uint8(unitsEzFlowFlagEZ_FLOW_TCP) != 0
			unfragmented := out.Skb.Flags&uint8(unitsEzFlowFlagEZ_FLOW_FRAG) == 0
			switch {
			case out.Quick >= 0:
				if !tcpRead || !unfragmented || uint8(out.Quick) != out.Skb.TcpFlags {
					t.Errorf("quick flags %#x, ez_parse %+v (ret %d)", out.Quick, out.Skb, c.ret)
				}
			case out.Quick == -1: // EZ_QUICK_NOT_TCP
				if tcpRead && unfragmented {
					t.Errorf("quick: not TCP, ez_parse read flags %#x", out.Skb.TcpFlags)
				}
			case out.Quick == -2: // EZ_QUICK_UNKNOWN
				if tcpRead {
					t.Errorf("quick: unknown, ez_parse read flags %#x", out.Skb.TcpFlags)
				}
			default:
				t.Errorf("quick: %d", out.Quick)
			}
			if (out.SynOk != 0) != c.syn {
				t.Fatalf("parse_syn accepted: %d, want %v", out.SynOk, c.syn)
			}
			if !c.syn {
				return
			}
			if (out.SynAck != 0) != c.synAck || out.SynPayload != c.synLoad {
				t.Errorf("parse_syn ack %d payload %d, want %v %d", out.SynAck, out.SynPayload, c.synAck, c.synLoad)
			}
			// The key is v4-mapped, ports host order, netns unset (the egress program sets it).
			want := unitsEzConnKey{ClientPort: c.want.Sport, ServerPort: c.want.Dport}
			want.ClientIp, want.ServerIp = keyAddr(c.want.Family, c.want.Saddr), keyAddr(c.want.Family, c.want.Daddr)
			if out.SynKey != want {
				t.Errorf("parse_syn key:\n got %+v\nwant %+v", out.SynKey, want)
			}
		})
	}
}

func keyAddr(family uint8, w [4]uint32) [16]uint8 {
	var b [16]byte
	for i, v := range w {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	if family == 4 {
		return netip.AddrFrom4([4]byte(b[:4])).As16()
	}
	return b
}

// sockopsPort is remote_port as sockops reports it on little endian: the
// network-order port in the upper 16 bits.
func sockopsPort(p uint16) uint32 {
	return uint32(p>>8|p<<8) << 16
}

func be32(a string) uint32 {
	b := netip.MustParseAddr(a).As4()
	return binary.LittleEndian.Uint32(b[:])
}

func TestKey(t *testing.T) {
	o := load(t, 0)
	const cookie = 0x1122334455667788
	v4 := func(local, remote string, lport, rport uint16) unitsEzSockEnds {
		return unitsEzSockEnds{Family: 2, LocalIp4: be32(local), RemoteIp4: be32(remote), LocalPort: uint32(lport), RemotePort: sockopsPort(rport)}
	}
	v6 := func(local, remote string, lport, rport uint16) unitsEzSockEnds {
		return unitsEzSockEnds{Family: 10, LocalIp6: words(local), RemoteIp6: words(remote), LocalPort: uint32(lport), RemotePort: sockopsPort(rport)}
	}
	cases := []struct {
		name   string
		ends   unitsEzSockEnds
		server bool
		want   unitsEzConnKey
	}{{
		name: "ipv4 client: v4-mapped, no netns",
		ends: v4("10.0.0.1", "10.0.0.2", 40000, 8080),
		want: unitsEzConnKey{ClientIp: mapped("::ffff:10.0.0.1"), ServerIp: mapped("::ffff:10.0.0.2"), ClientPort: 40000, ServerPort: 8080},
	}, {
		name: "ipv4 server: ends swapped", server: true,
		ends: v4("10.0.0.2", "10.0.0.1", 8080, 40000),
		want: unitsEzConnKey{ClientIp: mapped("::ffff:10.0.0.1"), ServerIp: mapped("::ffff:10.0.0.2"), ClientPort: 40000, ServerPort: 8080},
	}, {
		name: "dual-stack listener sees the same key as the ipv4 client", server: true,
		ends: v6("::ffff:10.0.0.2", "::ffff:10.0.0.1", 8080, 40000),
		want: unitsEzConnKey{ClientIp: mapped("::ffff:10.0.0.1"), ServerIp: mapped("::ffff:10.0.0.2"), ClientPort: 40000, ServerPort: 8080},
	}, {
		name: "ipv4 loopback: netns cookie",
		ends: v4("127.0.0.1", "127.0.0.1", 1, 258),
		want: unitsEzConnKey{Netns: cookie, ClientIp: mapped("::ffff:127.0.0.1"), ServerIp: mapped("::ffff:127.0.0.1"), ClientPort: 1, ServerPort: 258},
	}, {
		name: "127/8 on one end is loopback",
		ends: v4("10.0.0.1", "127.8.9.10", 65535, 443),
		want: unitsEzConnKey{Netns: cookie, ClientIp: mapped("::ffff:10.0.0.1"), ServerIp: mapped("::ffff:127.8.9.10"), ClientPort: 65535, ServerPort: 443},
	}, {
		name: "ipv6 ::1: netns cookie",
		ends: v6("::1", "::1", 5000, 6000),
		want: unitsEzConnKey{Netns: cookie, ClientIp: mapped("::1"), ServerIp: mapped("::1"), ClientPort: 5000, ServerPort: 6000},
	}, {
		name: "ipv6 global: no netns",
		ends: v6("fd00::1", "2001:db8::2", 5000, 6000),
		want: unitsEzConnKey{ClientIp: mapped("fd00::1"), ServerIp: mapped("2001:db8::2"), ClientPort: 5000, ServerPort: 6000},
	}, {
		name: "::2 is not loopback",
		ends: v6("::2", "fd00::2", 1, 2),
		want: unitsEzConnKey{ClientIp: mapped("::2"), ServerIp: mapped("fd00::2"), ClientPort: 1, ServerPort: 2},
	}}
	var zero uint32
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := unitsTestKeyIn{Ends: c.ends, NetnsCookie: cookie}
			if c.server {
				in.Server = 1
			}
			if err := o.KeyIn.Put(&zero, &in); err != nil {
				t.Fatal(err)
			}
			if ret := run(t, o.TestKey, make([]byte, 64)); ret != 0 {
				t.Fatalf("test_key returned %d", ret)
			}
			var got unitsEzConnKey
			if err := o.KeyOut.Lookup(&zero, &got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func cidr(p string) unitsEzCidrKey {
	pf := netip.MustParsePrefix(p)
	k := unitsEzCidrKey{Prefixlen: uint32(pf.Bits()), Ip: pf.Addr().As16()}
	if pf.Addr().Is4() {
		k.Prefixlen += 96
	}
	return k
}

func TestSelect(t *testing.T) {
	key := func(client, server string, port uint16) unitsEzConnKey {
		return unitsEzConnKey{ClientIp: mapped(client), ServerIp: mapped(server), ClientPort: 40000, ServerPort: port}
	}
	type rules struct {
		ports map[uint32]unitsEzRule
		cidrs map[string]unitsEzRule
	}
	cases := []struct {
		name  string
		flags unitsEzCfgFlag
		rules rules
		key   unitsEzConnKey
		want  bool
	}{
		{name: "no rules: selected", key: key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 80), want: true},
		{name: "no rules, ipv6: selected", key: key("fd00::1", "fd00::2", 80), want: true},
		{name: "ipv6 off: ipv6 excluded", flags: unitsEzCfgFlagEZ_CFG_NO_IPV6, key: key("fd00::1", "fd00::2", 80)},
		{name: "ipv6 off: one ipv6 end excluded", flags: unitsEzCfgFlagEZ_CFG_NO_IPV6, key: key("::ffff:10.0.0.1", "fd00::2", 80)},
		{name: "ipv6 off: v4-mapped selected", flags: unitsEzCfgFlagEZ_CFG_NO_IPV6, key: key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 80), want: true},
		{name: "port excluded", rules: rules{ports: map[uint32]unitsEzRule{6379: unitsEzRuleEZ_RULE_EXCLUDE}},
			key: key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 6379)},
		{name: "other port not excluded", rules: rules{ports: map[uint32]unitsEzRule{6379: unitsEzRuleEZ_RULE_EXCLUDE}},
			key: key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 6380), want: true},
		{name: "port allowlist: included", flags: unitsEzCfgFlagEZ_CFG_PORT_ALLOWLIST,
			rules: rules{ports: map[uint32]unitsEzRule{8080: unitsEzRuleEZ_RULE_INCLUDE}}, key: key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 8080), want: true},
		{name: "port allowlist: not listed", flags: unitsEzCfgFlagEZ_CFG_PORT_ALLOWLIST,
			rules: rules{ports: map[uint32]unitsEzRule{8080: unitsEzRuleEZ_RULE_INCLUDE}}, key: key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 8081)},
		{name: "client port does not count", flags: unitsEzCfgFlagEZ_CFG_PORT_ALLOWLIST,
			rules: rules{ports: map[uint32]unitsEzRule{40000: unitsEzRuleEZ_RULE_INCLUDE}}, key: key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 8081)},
		{name: "cidr excluded", rules: rules{cidrs: map[string]unitsEzRule{"10.0.0.0/8": unitsEzRuleEZ_RULE_EXCLUDE}},
			key: key("::ffff:10.0.0.1", "::ffff:192.168.0.2", 80)},
		{name: "longest prefix includes inside an excluded /8",
			rules: rules{cidrs: map[string]unitsEzRule{"10.0.0.0/8": unitsEzRuleEZ_RULE_EXCLUDE, "10.1.0.0/16": unitsEzRuleEZ_RULE_INCLUDE}},
			key:   key("::ffff:10.1.2.3", "::ffff:10.1.9.9", 80), want: true},
		{name: "longest prefix: one end outside the /16",
			rules: rules{cidrs: map[string]unitsEzRule{"10.0.0.0/8": unitsEzRuleEZ_RULE_EXCLUDE, "10.1.0.0/16": unitsEzRuleEZ_RULE_INCLUDE}},
			key:   key("::ffff:10.1.2.3", "::ffff:10.2.0.1", 80)},
		{name: "cidr allowlist: both inside", flags: unitsEzCfgFlagEZ_CFG_CIDR_ALLOWLIST,
			rules: rules{cidrs: map[string]unitsEzRule{"10.0.0.0/8": unitsEzRuleEZ_RULE_INCLUDE, "fd00::/64": unitsEzRuleEZ_RULE_INCLUDE}},
			key:   key("::ffff:10.0.0.1", "fd00::5", 80), want: true},
		{name: "cidr allowlist: one outside", flags: unitsEzCfgFlagEZ_CFG_CIDR_ALLOWLIST,
			rules: rules{cidrs: map[string]unitsEzRule{"10.0.0.0/8": unitsEzRuleEZ_RULE_INCLUDE}},
			key:   key("::ffff:10.0.0.1", "::ffff:11.0.0.1", 80)},
		{name: "cidr allowlist with a longer exclude", flags: unitsEzCfgFlagEZ_CFG_CIDR_ALLOWLIST,
			rules: rules{cidrs: map[string]unitsEzRule{"10.0.0.0/8": unitsEzRuleEZ_RULE_INCLUDE, "10.0.0.0/24": unitsEzRuleEZ_RULE_EXCLUDE}},
			key:   key("::ffff:10.0.0.1", "::ffff:10.9.0.1", 80)},
		{name: "port exclude wins over cidr include", flags: unitsEzCfgFlagEZ_CFG_CIDR_ALLOWLIST,
			rules: rules{ports: map[uint32]unitsEzRule{22: unitsEzRuleEZ_RULE_EXCLUDE}, cidrs: map[string]unitsEzRule{"10.0.0.0/8": unitsEzRuleEZ_RULE_INCLUDE}},
			key:   key("::ffff:10.0.0.1", "::ffff:10.0.0.2", 22)},
	}
	var zero uint32
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := load(t, c.flags)
			for p, r := range c.rules.ports {
				if err := o.PortRules.Put(&p, uint32(r)); err != nil {
					t.Fatal(err)
				}
			}
			for p, r := range c.rules.cidrs {
				k := cidr(p)
				if err := o.CIDRRules.Put(&k, uint32(r)); err != nil {
					t.Fatal(err)
				}
			}
			if err := o.KeyOut.Put(&zero, &c.key); err != nil {
				t.Fatal(err)
			}
			ret := run(t, o.TestSelect, make([]byte, 64))
			if ret > 1 {
				t.Fatalf("test_select returned %d", ret)
			}
			if got := ret == 1; got != c.want {
				t.Errorf("selected %v, want %v", got, c.want)
			}
		})
	}
}

// TestUnreadBound: ez_unread_bound (bpf/lib/bound.h), the bound on a
// receiver's redirected-but-unread bytes.
func TestUnreadBound(t *testing.T) {
	const autoMax = 4 << 20
	cases := []struct {
		name string
		in   unitsTestBound
		want uint32
	}{
		{"autotuning: tcp_rmem max above the cap", unitsTestBound{Rcvbuf: 131072, RmemMax: 32 << 20}, autoMax},
		{"autotuning: tcp_rmem max below the cap", unitsTestBound{Rcvbuf: 131072, RmemMax: 1 << 20}, 1 << 20},
		{"autotuning: tcp_rmem max unreadable", unitsTestBound{Rcvbuf: 131072}, autoMax},
		{"SO_RCVBUF locked", unitsTestBound{Userlocks: 2, Rcvbuf: 262144, RmemMax: 32 << 20}, 262144},
		{"SO_SNDBUF locked only", unitsTestBound{Userlocks: 1, Rcvbuf: 262144, RmemMax: 32 << 20}, autoMax},
		{"SO_RCVBUF locked above the cap", unitsTestBound{Userlocks: 3, Rcvbuf: 16 << 20, RmemMax: 32 << 20}, 16 << 20},
		{"override wins", unitsTestBound{Override: 1 << 20, Userlocks: 2, Rcvbuf: 262144, RmemMax: 32 << 20}, 1 << 20},
		{"kernel backpressure: tcp_rmem max, uncapped", unitsTestBound{Rcvbuf: 131072, RmemMax: 32 << 20, KernelBp: 1}, 32 << 20},
		{"kernel backpressure: tcp_rmem max below the cap", unitsTestBound{Rcvbuf: 131072, RmemMax: 1 << 20, KernelBp: 1}, 1 << 20},
		{"kernel backpressure: tcp_rmem max unreadable", unitsTestBound{Rcvbuf: 131072, KernelBp: 1}, autoMax},
		{"kernel backpressure: SO_RCVBUF locked", unitsTestBound{Userlocks: 2, Rcvbuf: 262144, RmemMax: 32 << 20, KernelBp: 1}, 262144},
		{"kernel backpressure: override wins", unitsTestBound{Override: 1 << 20, RmemMax: 32 << 20, KernelBp: 1}, 1 << 20},
	}
	o := load(t, 0)
	var zero uint32
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			in.Out = 0xdeadbeef
			if err := o.BoundIO.Put(&zero, &in); err != nil {
				t.Fatal(err)
			}
			if ret := run(t, o.TestUnreadBound, eth(ethIPv4, make([]byte, 40))); ret != 0 {
				t.Fatalf("program returned %d", ret)
			}
			var out unitsTestBound
			if err := o.BoundIO.Lookup(&zero, &out); err != nil {
				t.Fatal(err)
			}
			if out.Out != c.want {
				t.Errorf("bound %d, want %d", out.Out, c.want)
			}
		})
	}
}
