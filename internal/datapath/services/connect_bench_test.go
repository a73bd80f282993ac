package services

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/netprobe"
	"github.com/eztunnel/eztunnel/internal/stats"
)

// BenchmarkConnectCount: connect() latency through the ClusterIP
// translation with 1 and with 10,000 Services, interleaved in one run (the
// issue's target: within 5 % of the 1-Service value at 10,000). Two load
// balancers, one per cgroup, hold 1 and 10,000 Services (IPv4 and IPv6
// ClusterIPs, one backend per family: a loopback listener); the process
// moves between the two cgroups each round (which goes first alternates)
// and connects to a random Service of the set each time. Each connect is a
// full loopback handshake, closed with RST (no TIME_WAIT). Reported: p50
// and p99 per count and family, and their ratios (10,000 / 1).
//
//	sudo go test -run XXX -bench ConnectCount -benchtime 10x ./internal/datapath/services
func BenchmarkConnectCount(b *testing.B) {
	lns := map[string]net.Listener{}
	for _, fam := range []string{"tcp4", "tcp6"} {
		addr := "127.0.0.1:0"
		if fam == "tcp6" {
			addr = "[::1]:0"
		}
		ln, err := net.Listen(fam, addr)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ln.Close() })
		go netprobe.AcceptAndClose(ln)
		lns[fam] = ln
	}
	port := func(fam string) uint16 { return uint16(lns[fam].Addr().(*net.TCPAddr).Port) }
	counts := []int{1, 10000}
	lbs, cgs, self := countLBs(b, counts, TCP,
		netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port("tcp4")),
		netip.AddrPortFrom(netip.MustParseAddr("::1"), port("tcp6")))
	r := rand.New(rand.NewPCG(1, 2))
	lat := map[string][]time.Duration{}
	order := slices.Clone(counts)
	const perRound = 400
	for b.Loop() {
		order[0], order[1] = order[1], order[0]
		for _, n := range order {
			if err := joinCgroup(cgs[n]); err != nil {
				b.Fatal(err)
			}
			for i := range perRound {
				v6 := i%2 == 1
				vip := vip4(r.IntN(n))
				if v6 {
					vip = vip6(r.IntN(n))
				}
				d, err := netprobe.Connect(netip.AddrPortFrom(vip, 80))
				if err != nil {
					b.Fatalf("%d Services: connect %s: %v", n, vip, err)
				}
				k := fmt.Sprintf("v4@%d", n)
				if v6 {
					k = fmt.Sprintf("v6@%d", n)
				}
				lat[k] = append(lat[k], d)
			}
		}
	}
	checkCounters(b, self, lbs, func(n int, c Counters) error {
		if got, want := c["tcp_connect"], uint64(len(lat[fmt.Sprintf("v4@%d", n)])+len(lat[fmt.Sprintf("v6@%d", n)])); got != want {
			return fmt.Errorf("%d connects translated, %d made", got, want)
		}
		return nil
	})
	reportRatios(b, lat, "")
	b.ReportMetric(0, "ns/op")
}

// countLBs loads one load balancer per Service count, each holding that
// many IPv4 and IPv6 ClusterIPs (vip4(i), vip6(i), port 80, proto) with the
// one backend of each family, and attaches each to a cgroup of its own
// (removed at cleanup, after the process went back to its own cgroup,
// self).
func countLBs(b *testing.B, counts []int, proto Proto, be4, be6 Backend) (lbs map[int]*LB, cgs map[int]string, self string) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Fatal("needs root (BPF, cgroups)")
	}
	root, err := cgroupv2.Root()
	if err != nil {
		b.Fatal(err)
	}
	if self, err = ownCgroup(root); err != nil {
		b.Fatal(err)
	}
	base, err := os.MkdirTemp(root, "eztunnel-count-bench-")
	if err != nil {
		b.Fatal(err)
	}
	cgs = map[int]string{}
	b.Cleanup(func() {
		joinCgroup(self)
		for _, n := range counts {
			os.Remove(cgs[n])
		}
		os.Remove(base)
	})
	for _, n := range counts {
		cgs[n] = filepath.Join(base, strconv.Itoa(n))
		if err := os.Mkdir(cgs[n], 0o755); err != nil {
			b.Fatal(err)
		}
	}
	lbs = map[int]*LB{}
	for _, n := range counts {
		lb, err := Load(Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { lb.Close() })
		for i := range n {
			if err := lb.SetFrontend(Frontend{Addr: vip4(i), Port: 80, Proto: proto}, Target{Backends: []Backend{be4}}); err != nil {
				b.Fatal(err)
			}
			if err := lb.SetFrontend(Frontend{Addr: vip6(i), Port: 80, Proto: proto}, Target{Backends: []Backend{be6}}); err != nil {
				b.Fatal(err)
			}
		}
		if err := lb.Attach(cgs[n]); err != nil {
			b.Fatal(err)
		}
		lbs[n] = lb
	}
	return lbs, cgs, self
}

// checkCounters moves the process back to its own cgroup (self), then
// fails unless check accepts the counters of each count's load balancer:
// the path measured is the one meant.
func checkCounters(b *testing.B, self string, lbs map[int]*LB, check func(count int, c Counters) error) {
	if err := joinCgroup(self); err != nil {
		b.Fatal(err)
	}
	for n, lb := range lbs {
		c, err := lb.Counters()
		if err != nil {
			b.Fatal(err)
		}
		if err := check(n, c); err != nil {
			b.Fatalf("%d Services: %v: not the path measured", n, err)
		}
	}
}

// reportRatios reports the p50 and p99 of lat[prefix+fam+"@"+count] for
// counts 1 and 10,000, and their ratios (10,000 / 1), named
// prefix+fam+"-p50-...".
func reportRatios(b *testing.B, lat map[string][]time.Duration, prefix string) {
	q := func(k string, p float64) float64 {
		if len(lat[k]) == 0 {
			b.Fatalf("no samples for %s", k)
		}
		return stats.QuantileMicros(lat[k], p)
	}
	for _, fam := range []string{"v4", "v6"} {
		for _, p := range []struct {
			name string
			q    float64
		}{{"p50", 0.5}, {"p99", 0.99}} {
			one, many := q(prefix+fam+"@1", p.q), q(prefix+fam+"@10000", p.q)
			b.ReportMetric(one, prefix+fam+"-"+p.name+"-us@1")
			b.ReportMetric(many, prefix+fam+"-"+p.name+"-us@10000")
			b.ReportMetric(many/one, prefix+fam+"-"+p.name+"-ratio")
		}
	}
}

func vip4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}) }
func vip6(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd96::%x", i+1)) }

// ownCgroup is this process's cgroup v2 directory under root.
func ownCgroup(root string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return filepath.Join(root, p), nil
		}
	}
	return "", fmt.Errorf("no cgroup v2 line in /proc/self/cgroup")
}

// joinCgroup moves the whole process (every thread) into dir.
func joinCgroup(dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
}
