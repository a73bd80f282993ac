// Package testpacket builds the frames that the program tests (BPF_PROG_TEST_RUN)
// feed the datapath's programs: Ethernet, IPv4 (with options, fragment bits or
// a wrong total length), IPv6 and TCP/UDP, byte by byte so a test can also cut
// or bend them. Only tests import it.
package testpacket

import (
	"encoding/binary"
	"net/netip"
	"slices"
)

// EtherType values and TCP flags the tests use.
const (
	EthIPv4 = 0x0800
	EthIPv6 = 0x86dd
	EthARP  = 0x0806

	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPPsh = 0x08
	TCPAck = 0x10
)

// Sum adds b to the Internet checksum's one's complement sum and folds it;
// a checksum is ^uint16(Sum(...)), and a header with a valid one sums to 0xffff.
func Sum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum
}

// Checksum is the Internet checksum of b.
func Checksum(b []byte) uint16 { return ^uint16(Sum(0, b)) }

// PseudoSum is the sum of the pseudo-header of an L4 segment of n bytes.
func PseudoSum(src, dst netip.Addr, proto uint8, n int) uint32 {
	sum := Sum(Sum(0, src.AsSlice()), dst.AsSlice())
	return Sum(sum, []byte{0, proto, byte(n >> 8), byte(n)})
}

// L4ChecksumOffset is where proto's checksum is in its header: TCP 16, UDP 6,
// -1 for what WithL4Checksum leaves alone.
func L4ChecksumOffset(proto uint8) int {
	switch proto {
	case 6:
		return 16
	case 17:
		return 6
	}
	return -1
}

// WithL4Checksum is a copy of the TCP or UDP segment l4 with its checksum
// set for src and dst (UDP's 0 sent as 0xffff); another proto's l4 unchanged.
func WithL4Checksum(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	l4 = slices.Clone(l4)
	off := L4ChecksumOffset(proto)
	if off < 0 {
		return l4
	}
	binary.BigEndian.PutUint16(l4[off:], 0)
	c := ^uint16(Sum(PseudoSum(src, dst, proto, len(l4)), l4))
	if proto == 17 && c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(l4[off:], c)
	return l4
}

// Eth is an Ethernet frame from src to dst of type typ carrying l3.
func Eth(dst, src []byte, typ uint16, l3 []byte) []byte {
	b := make([]byte, 14, 14+len(l3))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], typ)
	return append(b, l3...)
}

// IPv4 is an IPv4 header; TotLen 0 means the real length.
type IPv4 struct {
	Src, Dst string
	Proto    uint8
	TTL      uint8
	ID       uint16
	Frag     uint16 // flags and fragment offset
	Opts     []byte // whole 4-byte words
	TotLen   int
}

// Packet is the header, with its checksum, followed by l4.
func (h IPv4) Packet(l4 []byte) []byte {
	hl := 20 + len(h.Opts)
	b := make([]byte, hl, hl+len(l4))
	b[0] = 0x40 | byte(hl/4)
	tot := h.TotLen
	if tot == 0 {
		tot = hl + len(l4)
	}
	binary.BigEndian.PutUint16(b[2:], uint16(tot))
	binary.BigEndian.PutUint16(b[4:], h.ID)
	binary.BigEndian.PutUint16(b[6:], h.Frag)
	b[8] = h.TTL
	b[9] = h.Proto
	s, d := netip.MustParseAddr(h.Src).As4(), netip.MustParseAddr(h.Dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	copy(b[20:], h.Opts)
	binary.BigEndian.PutUint16(b[10:], Checksum(b))
	return append(b, l4...)
}

// IPv6 is an IPv6 header (next header next, hop limit hlim) followed by l4.
func IPv6(src, dst string, hlim, next uint8, l4 []byte) []byte {
	b := make([]byte, 40, 40+len(l4))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(l4)))
	b[6] = next
	b[7] = hlim
	s, d := netip.MustParseAddr(src).As16(), netip.MustParseAddr(dst).As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	return append(b, l4...)
}

// TCP is a TCP header; its checksum is left 0 (WithL4Checksum sets it).
type TCP struct {
	SrcPort, DstPort uint16
	Seq, Ack         uint32
	Flags            uint8
	Window           uint16
	Opts             []byte // whole 4-byte words
}

// Segment is the header followed by payload.
func (h TCP) Segment(payload []byte) []byte {
	hl := 20 + len(h.Opts)
	b := make([]byte, hl, hl+len(payload))
	binary.BigEndian.PutUint16(b[0:], h.SrcPort)
	binary.BigEndian.PutUint16(b[2:], h.DstPort)
	binary.BigEndian.PutUint32(b[4:], h.Seq)
	binary.BigEndian.PutUint32(b[8:], h.Ack)
	b[12] = byte(hl/4) << 4
	b[13] = h.Flags
	binary.BigEndian.PutUint16(b[14:], h.Window)
	copy(b[20:], h.Opts)
	return append(b, payload...)
}

// UDP is a UDP header (checksum 0) followed by payload.
func UDP(sport, dport uint16, payload []byte) []byte {
	b := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint16(b[4:], uint16(8+len(payload)))
	return append(b, payload...)
}
