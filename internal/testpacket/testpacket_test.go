package testpacket

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestChecksums checks the sums against headers whose checksums are known:
// the IPv4 header of the usual worked example (checksum 0xb861), and a UDP
// datagram whose checksum, once set, makes the pseudo-header sum 0xffff.
func TestChecksums(t *testing.T) {
	h := IPv4{Src: "192.168.0.1", Dst: "192.168.0.199", Proto: 17, TTL: 64, Frag: 0x4000, TotLen: 0x73}.Packet(nil)
	if got := binary.BigEndian.Uint16(h[10:]); got != 0xb861 {
		t.Errorf("IPv4 header checksum %#04x, want 0xb861 (%x)", got, h)
	}
	if s := Sum(0, h); s != 0xffff {
		t.Errorf("IPv4 header sums to %#04x, want 0xffff", s)
	}
	src, dst := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	for _, proto := range []uint8{6, 17} {
		var l4 []byte
		if proto == 6 {
			l4 = TCP{SrcPort: 1, DstPort: 2, Flags: TCPSyn}.Segment([]byte("odd"))
		} else {
			l4 = UDP(1, 2, []byte("odd"))
		}
		c := WithL4Checksum(src, dst, proto, l4)
		if binary.BigEndian.Uint16(l4[L4ChecksumOffset(proto):]) != 0 {
			t.Errorf("proto %d: WithL4Checksum changed its argument", proto)
		}
		if s := Sum(PseudoSum(src, dst, proto, len(c)), c); s != 0xffff {
			t.Errorf("proto %d: segment with its checksum sums to %#04x, want 0xffff", proto, s)
		}
	}
}
