package services

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/netprobe"
)

// benchCPU is the CPU the UDP benchmarks' sender and echo run on.
const benchCPU = 1

// BenchmarkUDPCount: round-trip time of unconnected UDP datagrams through
// the ClusterIP translation (sendmsg4/6 to the backend, recvmsg4/6 back to
// the Service's address) with 1 and with 10,000 Services, interleaved in
// one run (the target for UDP latency: within 5 % of the 1-Service
// value at 10,000). Set up as BenchmarkConnectCount, with UDP Services and
// a loopback echo as the backend of each family (netprobe.Echo). Each round, per count
// (which goes first alternates) and family, 20 flows: a new socket sends
// 20 datagrams to one random Service, one at a time, each answered by the
// echo before the next. Every reply must come from the Service's address
// with the payload sent. Reported apart: a flow's first datagram (the one
// that creates the socket's translation state, as D-ITG's first packet)
// and the others (a flow in progress: the socket's backend is kept), p50
// and p99 per count and family, and their ratios (10,000 / 1). The sender
// and the echo are pinned to one CPU (benchCPU, reported as "cpu"): on this
// VM a wake-up across CPUs costs 25 µs more or not at all, by run.
//
//	sudo go test -run XXX -bench UDPCount -benchtime 40x ./internal/datapath/services
func BenchmarkUDPCount(b *testing.B) {
	if runtime.NumCPU() <= benchCPU {
		b.Fatalf("needs CPU %d", benchCPU)
	}
	echo := map[string]Backend{}
	for fam, addr := range map[string]string{"v4": "127.0.0.1:0", "v6": "[::1]:0"} {
		fd, bound, err := netprobe.ListenUDP(netip.MustParseAddrPort(addr))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { unix.Shutdown(fd, unix.SHUT_RDWR); unix.Close(fd) })
		go netprobe.Echo(fd, benchCPU)
		echo[fam] = bound
	}
	counts := []int{1, 10000}
	lbs, cgs, self := countLBs(b, counts, UDP, echo["v4"], echo["v6"])
	runtime.LockOSThread() // one thread does every send and receive
	defer runtime.UnlockOSThread()
	unpin, err := netprobe.PinThread(benchCPU)
	if err != nil {
		b.Fatal(err)
	}
	defer unpin()
	r := rand.New(rand.NewPCG(3, 4))
	lat := map[string][]time.Duration{}
	sent := map[int]int{}
	order := slices.Clone(counts)
	const flows, perFlow = 20, 20
	for b.Loop() {
		order[0], order[1] = order[1], order[0]
		for _, n := range order {
			if err := joinCgroup(cgs[n]); err != nil {
				b.Fatal(err)
			}
			for i := range 2 * flows {
				fam, vip := "v4", vip4(r.IntN(n))
				if i%2 == 1 {
					fam, vip = "v6", vip6(r.IntN(n))
				}
				ds, err := netprobe.UDPFlow(0, netip.AddrPortFrom(vip, 80), perFlow)
				if err != nil {
					b.Fatalf("%d Services: %v", n, err)
				}
				sent[n] += perFlow
				first, rest := fmt.Sprintf("first-%s@%d", fam, n), fmt.Sprintf("flow-%s@%d", fam, n)
				lat[first] = append(lat[first], ds[0])
				lat[rest] = append(lat[rest], ds[1:]...)
			}
		}
	}
	checkCounters(b, self, lbs, func(n int, c Counters) error {
		if c["udp_send"] != uint64(sent[n]) || c["recv_reversed"] != uint64(sent[n]) {
			return fmt.Errorf("%d sends and %d receives translated, %d datagrams each way", c["udp_send"], c["recv_reversed"], sent[n])
		}
		return nil
	})
	b.ReportMetric(benchCPU, "cpu")
	reportRatios(b, lat, "first-")
	reportRatios(b, lat, "flow-")
	b.ReportMetric(0, "ns/op")
}
