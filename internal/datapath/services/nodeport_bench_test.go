package services

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// npLB loads a load balancer holding services Services laid out as the
// services bench does: each dual-stack (a ClusterIP frontend per family),
// the first min(services, 2767) with a NodePort (30000+i, both families),
// 4 backends each; node address 10.250.1.1.
func npLB(b *testing.B, services int) *LB {
	lb, err := Load(Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lb.Close() })
	if err := lb.SetNodeAddrs([]netip.Addr{netip.MustParseAddr("10.250.1.1")}); err != nil {
		b.Fatal(err)
	}
	var v4, v6 []Backend
	for i := range 4 {
		v4 = append(v4, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(2 + i)}), 8080))
		v6 = append(v6, netip.AddrPortFrom(netip.MustParseAddr(fmt.Sprintf("fd44::%d", 2+i)), 8080))
	}
	for i := range services {
		for _, f := range []struct {
			vip, any netip.Addr
			bes      []Backend
		}{
			{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), netip.IPv4Unspecified(), v4},
			{netip.MustParseAddr(fmt.Sprintf("fd96::%x", i+1)), netip.IPv6Unspecified(), v6},
		} {
			if err := lb.SetFrontend(Frontend{Addr: f.vip, Port: 80, Proto: TCP}, Target{Backends: f.bes}); err != nil {
				b.Fatal(err)
			}
			if i < 2767 {
				if err := lb.SetFrontend(Frontend{Addr: f.any, Port: uint16(30000 + i), Proto: TCP, NodePort: true}, Target{Backends: f.bes}); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	return lb
}

// ackTo is an Ethernet + IPv4 + TCP ACK from 10.250.1.2:40000 to
// 10.250.1.1:port: the NodePort program looks it up (NodePort, node
// address, conntrack) and, being of no known flow, leaves it (not_new).
func ackTo(port uint16) []byte {
	p := make([]byte, 14+20+20)
	binary.BigEndian.PutUint16(p[12:], 0x0800)
	ip := p[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 6
	binary.BigEndian.PutUint16(ip[2:], 40)
	copy(ip[12:], []byte{10, 250, 1, 2})
	copy(ip[16:], []byte{10, 250, 1, 1})
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], port)
	tcp[12], tcp[13] = 5<<4, 0x10 // ACK
	return p
}

// BenchmarkNodePortCount: the tc NodePort program's time per packet
// (BPF_PROG_TEST_RUN) with 1 Service and with 10,000 (2767 NodePorts per
// family), interleaved: rounds alternate the two load balancers (and which
// goes first), each round a packet to each of 256 random NodePorts of that
// load balancer (its one NodePort with 1 Service), run repeat times each
// (repeat 1: the next packet's lookups find another entry, less of it in
// the cache). Reports ns per packet of both and their ratio; it asserts
// nothing about them.
func BenchmarkNodePortCount(b *testing.B) {
	lbs := map[int]*LB{1: npLB(b, 1), 10000: npLB(b, 10000)}
	for _, repeat := range []int{20, 1} {
		b.Run(fmt.Sprintf("repeat=%d", repeat), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			sum := map[int]time.Duration{}
			runs := map[int]int{}
			order := []int{1, 10000}
			for b.Loop() {
				order[0], order[1] = order[1], order[0] // alternate which goes first
				for _, n := range order {
					for range 256 {
						port := uint16(30000 + r.IntN(min(n, 2767)))
						ret, d, err := lbs[n].objs.EzSvcNodeport.Benchmark(ackTo(port), repeat, nil)
						if err != nil {
							b.Fatal(err)
						}
						if ret != ^uint32(0) { // TCX_NEXT
							b.Fatalf("verdict %d", int32(ret))
						}
						sum[n] += d * time.Duration(repeat)
						runs[n] += repeat
					}
				}
			}
			for n, lb := range lbs {
				c, err := lb.Counters()
				if err != nil {
					b.Fatal(err)
				}
				if c["nodeport_not_new"] < uint64(runs[n]) {
					b.Fatalf("%d Services: %d packets left as not_new of %d run: not the path measured (%v)", n, c["nodeport_not_new"], runs[n], c)
				}
			}
			c1, c10k := float64(sum[1].Nanoseconds())/float64(runs[1]), float64(sum[10000].Nanoseconds())/float64(runs[10000])
			b.ReportMetric(c1, "ns/pkt@1")
			b.ReportMetric(c10k, "ns/pkt@10000")
			b.ReportMetric(c10k/c1, "ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}
