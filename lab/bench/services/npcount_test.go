package services

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	lb "github.com/eztunnel/eztunnel/internal/datapath/services"
	"github.com/eztunnel/eztunnel/internal/netprobe"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// BenchmarkNodePortConnectCount: connect() latency from the external host
// to a NodePort (externalTrafficPolicy Local, a backend pod on the node)
// with 1 and with 10,000 Services, interleaved in one run (the issue's
// target: within 5 % of the 1-Service value at 10,000). A one-node lab; two
// load balancers on the node's uplink, each with its own node address:
// one holds 1 Service, the other 10,000 (a ClusterIP each, NodePorts for
// the first 2767, as in bench services). The external host alternates
// rounds between the two addresses (which goes first alternates) and
// connects to a random NodePort of the set; every connect must be
// translated by the load balancer it was meant for. Both programs sit on
// the same device, so each packet runs both (the other's is a node-address
// miss). The two sub-benchmarks swap which address, and which program
// comes first on the device, serves which count.
//
//	sudo go test -run XXX -bench NodePortConnectCount -benchtime 20x ./lab/bench/services
func BenchmarkNodePortConnectCount(b *testing.B) { runSwapped(b, npConnectCount) }

// runSwapped runs fn as two sub-benchmarks: as built, and with which node
// address (and load balancer, attached in this order) serves which count
// swapped.
func runSwapped(b *testing.B, fn func(b *testing.B, swap bool)) {
	if os.Geteuid() != 0 {
		b.Fatal("needs root (BPF, network namespaces)")
	}
	for _, swap := range []bool{false, true} {
		b.Run(fmt.Sprintf("swapped=%v", swap), func(b *testing.B) { fn(b, swap) })
	}
}

func npConnectCount(b *testing.B, swap bool) {
	np := newNPLab(b, swap, lb.TCP, false)
	r := rand.New(rand.NewPCG(3, 4))
	lat := map[string][]time.Duration{}
	order := slices.Clone(np.counts)
	const perRound = 200
	for b.Loop() {
		order[0], order[1] = order[1], order[0]
		for _, c := range order {
			if err := np.l.External.Do(func() error {
				for range perRound {
					to := netip.AddrPortFrom(np.addrs4[c], uint16(30000+r.IntN(min(c, npCount))))
					d, err := netprobe.Connect(to)
					if err != nil {
						return fmt.Errorf("%d Services: connect %s: %w", c, to, err)
					}
					k := fmt.Sprintf("v4@%d", c)
					lat[k] = append(lat[k], d)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	np.requireNew(b, func(c int) int { return len(lat[fmt.Sprintf("v4@%d", c)]) })
	for _, p := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p99", 0.99}} {
		one, many := stats.QuantileMicros(lat["v4@1"], p.q), stats.QuantileMicros(lat["v4@10000"], p.q)
		b.ReportMetric(one, p.name+"-us@1")
		b.ReportMetric(many, p.name+"-us@10000")
		b.ReportMetric(many/one, p.name+"-ratio")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkNodePortUDPCount: round trips of UDP flows from the external
// host to a NodePort (externalTrafficPolicy Local, a UDP echo in a backend
// pod on the node) with 1 and with 10,000 Services, interleaved in one run
// (the target for UDP latency: within 5 % of the 1-Service value
// at 10,000). The lab of BenchmarkNodePortConnectCount with UDP Services
// and node addresses of both families. Each round, per count (which goes
// first alternates) and family, 10 flows: a new socket sends 20 datagrams
// to one random NodePort from a port no other flow of the run used, one
// at a time, each echoed before the next;
// every reply must come from the NodePort's address. Reported apart: a
// flow's first datagram (the one the load balancer translates and sets up
// the flow for) and the others (the flow's conntrack entry), p50 and p99
// per count and family, and their ratios (10,000 / 1). The sender and the
// echo are pinned to one CPU (benchCPU, reported as "cpu").
//
//	sudo go test -run XXX -bench NodePortUDPCount -benchtime 20x ./lab/bench/services
func BenchmarkNodePortUDPCount(b *testing.B) { runSwapped(b, npUDPCount) }

func npUDPCount(b *testing.B, swap bool) {
	np := newNPLab(b, swap, lb.UDP, true)
	r := rand.New(rand.NewPCG(5, 6))
	lat := map[string][]time.Duration{}
	flows := map[int]int{}
	order := slices.Clone(np.counts)
	const perRound, perFlow = 10, 20
	for b.Loop() {
		order[0], order[1] = order[1], order[0]
		for _, c := range order {
			if err := np.l.External.Do(func() error {
				unpin, err := netprobe.PinThread(benchCPU) // Do holds the thread
				if err != nil {
					return err
				}
				defer unpin()
				for i := range 2 * perRound {
					fam, addr := "v4", np.addrs4[c]
					if i%2 == 1 {
						fam, addr = "v6", np.addrs6[c]
					}
					to := netip.AddrPortFrom(addr, uint16(30000+r.IntN(min(c, npCount))))
					// A port of its own per flow (below the ephemeral
					// range): a port used again would meet its earlier
					// flow's conntrack entry, not the load balancer.
					ds, err := netprobe.UDPFlow(uint16(20000+flows[c]%10000), to, perFlow)
					if err != nil {
						return fmt.Errorf("%d Services: %w", c, err)
					}
					flows[c]++
					first, rest := fmt.Sprintf("first-%s@%d", fam, c), fmt.Sprintf("flow-%s@%d", fam, c)
					lat[first] = append(lat[first], ds[0])
					lat[rest] = append(lat[rest], ds[1:]...)
				}
				return nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	np.requireNew(b, func(c int) int { return flows[c] })
	b.ReportMetric(benchCPU, "cpu")
	for _, kind := range []string{"first-", "flow-"} {
		for _, fam := range []string{"v4", "v6"} {
			for _, p := range []struct {
				name string
				q    float64
			}{{"p50", 0.5}, {"p99", 0.99}} {
				one, many := stats.QuantileMicros(lat[kind+fam+"@1"], p.q), stats.QuantileMicros(lat[kind+fam+"@10000"], p.q)
				b.ReportMetric(one, kind+fam+"-"+p.name+"-us@1")
				b.ReportMetric(many, kind+fam+"-"+p.name+"-us@10000")
				b.ReportMetric(many/one, kind+fam+"-"+p.name+"-ratio")
			}
		}
	}
	b.ReportMetric(0, "ns/op")
}

// benchCPU is the CPU the UDP benchmark's sender and echo run on.
const benchCPU = 1

// npCount is how many of the Services have a NodePort (the paper's split).
const npCount = 2767

// npLab is a one-node lab with a backend pod and two load balancers on the
// node's uplink, each with node addresses of its own: one holds 1
// Service, the other 10,000.
type npLab struct {
	l              *multinode.Lab
	counts         []int // in the order the load balancers were attached
	addrs4, addrs6 map[int]netip.Addr
	lbs            map[int]*lb.LB
}

// newNPLab builds the lab for proto: a ClusterIP per Service and NodePorts
// 30000.. for the first npCount (externalTrafficPolicy Local), IPv4 and,
// with v6, IPv6; the backend pod runs a TCP listener that accepts and
// closes, or a UDP echo, on port 8080. swap exchanges which addresses (and
// which program, attached first) serve which count.
func newNPLab(b *testing.B, swap bool, proto lb.Proto, v6 bool) *npLab {
	b.Helper()
	l, err := multinode.New(multinode.Options{Name: "bnpc", Nodes: 1, Mode: multinode.HostGW})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	n := l.Node(1)
	be, err := n.AddPod("be", false)
	if err != nil {
		b.Fatal(err)
	}
	if err := be.Do(func() error {
		for _, a := range []netip.Addr{be.IPv4, be.IPv6} {
			if err := serveBackend(b, proto, netip.AddrPortFrom(a, 8080)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	// Second node addresses on the uplink, for the second load balancer.
	second4, second6 := netip.MustParseAddr("192.168.88.200"), netip.MustParseAddr("fd89::200")
	for _, a := range []netip.Addr{l.External.IPv4, l.External.IPv6, n.UnderlayV4, n.UnderlayV6} {
		if a == second4 || a == second6 {
			b.Fatalf("address %s taken", a)
		}
	}
	np := &npLab{l: l, counts: []int{1, 10000},
		addrs4: map[int]netip.Addr{1: n.UnderlayV4, 10000: second4},
		addrs6: map[int]netip.Addr{1: n.UnderlayV6, 10000: second6},
		lbs:    map[int]*lb.LB{}}
	if swap {
		np.counts = []int{10000, 1}
		np.addrs4[1], np.addrs4[10000] = np.addrs4[10000], np.addrs4[1]
		np.addrs6[1], np.addrs6[10000] = np.addrs6[10000], np.addrs6[1]
	}
	var uplink int
	if err := n.Do(func() error {
		lk, err := netlink.LinkByName(n.Uplink)
		if err != nil {
			return err
		}
		uplink = lk.Attrs().Index
		for _, a := range []netip.Addr{second4, second6} {
			na := &netlink.Addr{IPNet: netlink.NewIPNet(net.IP(a.AsSlice())), Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(lk, na); err != nil {
				return fmt.Errorf("add %s: %w", a, err)
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	for _, c := range np.counts {
		balancer, err := lb.Load(lb.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { balancer.Close() })
		nodeAddrs := []netip.Addr{np.addrs4[c]}
		if v6 {
			nodeAddrs = append(nodeAddrs, np.addrs6[c])
		}
		if err := balancer.SetNodeAddrs(nodeAddrs); err != nil {
			b.Fatal(err)
		}
		for i := range c {
			fams := []struct{ vip, any, be netip.Addr }{{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), netip.IPv4Unspecified(), be.IPv4}}
			if v6 {
				fams = append(fams, struct{ vip, any, be netip.Addr }{netip.MustParseAddr(fmt.Sprintf("fd96::%x", i+1)), netip.IPv6Unspecified(), be.IPv6})
			}
			for _, f := range fams {
				backend := []lb.Backend{netip.AddrPortFrom(f.be, 8080)}
				if err := balancer.SetFrontend(lb.Frontend{Addr: f.vip, Port: 80, Proto: proto}, lb.Target{Backends: backend}); err != nil {
					b.Fatal(err)
				}
				if i < npCount {
					if err := balancer.SetFrontend(lb.Frontend{Addr: f.any, Port: uint16(30000 + i), Proto: proto, NodePort: true},
						lb.Target{Backends: backend, KeepSource: true}); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		if err := n.Do(func() error {
			_, _, err := balancer.SyncNodePortDevices([]int{uplink})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		np.lbs[c] = balancer
	}
	return np
}

// serveBackend serves proto on addr until the benchmark ends: TCP accepts
// and closes, UDP echoes each datagram.
func serveBackend(b *testing.B, proto lb.Proto, addr netip.AddrPort) error {
	if proto == lb.TCP {
		ln, err := net.Listen("tcp", addr.String())
		if err != nil {
			return err
		}
		b.Cleanup(func() { ln.Close() })
		go netprobe.AcceptAndClose(ln)
		return nil
	}
	fd, _, err := netprobe.ListenUDP(addr)
	if err != nil {
		return err
	}
	b.Cleanup(func() { unix.Shutdown(fd, unix.SHUT_RDWR); unix.Close(fd) })
	go netprobe.Echo(fd, benchCPU)
	return nil
}

// requireNew fails unless each load balancer set up at least made(count)
// NodePort flows: the path measured is the one meant.
func (np *npLab) requireNew(b *testing.B, made func(count int) int) {
	for _, c := range np.counts {
		k, err := np.lbs[c].Counters()
		if err != nil {
			b.Fatal(err)
		}
		if got := k["nodeport_new"]; got < uint64(made(c)) {
			b.Fatalf("%d Services: %d NodePort flows set up for %d made: not the path measured (%v)", c, got, made(c), k)
		}
	}
}
