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

	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
)

// BenchmarkConnectCount: connect() latency through the ClusterIP
// translation with 1 and with 10,000 Services, interleaved in one run (the
// issue's target: within 5 % of the 1-Service value at 10,000). Two load
// balancers, one per cgroup, hold 1 and 10,000 Services (IPv4 and IPv6
// ClusterIPs, 4 backends each, all on a loopback listener); the process
// moves between the two cgroups each round (which goes first alternates)
// and connects to a random Service of the set each time. Each connect is a
// full loopback handshake, closed with RST (no TIME_WAIT). Reported: p50
// and p99 per count and family, and their ratios (10,000 / 1).
//
//	sudo go test -run XXX -bench ConnectCount -benchtime 10x ./internal/datapath/services
func BenchmarkConnectCount(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Fatal("needs root (BPF, cgroups)")
	}
	root, err := cgroupv2.Root()
	if err != nil {
		b.Fatal(err)
	}
	self, err := ownCgroup(root)
	if err != nil {
		b.Fatal(err)
	}
	base, err := os.MkdirTemp(root, "eztunnel-connect-bench-")
	if err != nil {
		b.Fatal(err)
	}
	counts := []int{1, 10000}
	cgs := map[int]string{}
	for _, n := range counts {
		cgs[n] = filepath.Join(base, strconv.Itoa(n))
		if err := os.Mkdir(cgs[n], 0o755); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() {
		joinCgroup(self)
		for _, n := range counts {
			os.Remove(cgs[n])
		}
		os.Remove(base)
	})
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
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		lns[fam] = ln
	}
	port := func(fam string) uint16 { return uint16(lns[fam].Addr().(*net.TCPAddr).Port) }
	lbs := map[int]*LB{}
	for _, n := range counts {
		lb, err := Load(Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { lb.Close() })
		v4 := []Backend{netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port("tcp4"))}
		v6 := []Backend{netip.AddrPortFrom(netip.MustParseAddr("::1"), port("tcp6"))}
		for i := range n {
			if err := lb.SetFrontend(Frontend{Addr: vip4(i), Port: 80, Proto: TCP}, Target{Backends: v4}); err != nil {
				b.Fatal(err)
			}
			if err := lb.SetFrontend(Frontend{Addr: vip6(i), Port: 80, Proto: TCP}, Target{Backends: v6}); err != nil {
				b.Fatal(err)
			}
		}
		if err := lb.Attach(cgs[n]); err != nil {
			b.Fatal(err)
		}
		lbs[n] = lb
	}
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
				d, err := timedConnect(netip.AddrPortFrom(vip, 80))
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
	if err := joinCgroup(self); err != nil {
		b.Fatal(err)
	}
	for _, n := range counts {
		c, err := lbs[n].Counters()
		if err != nil {
			b.Fatal(err)
		}
		if got, want := c["tcp_connect"], uint64(len(lat[fmt.Sprintf("v4@%d", n)])+len(lat[fmt.Sprintf("v6@%d", n)])); got != want {
			b.Fatalf("%d Services: %d connects translated, %d made: not the path measured", n, got, want)
		}
	}
	q := func(k string, p float64) float64 {
		s := slices.Clone(lat[k])
		slices.Sort(s)
		return float64(s[int(p*float64(len(s)-1))].Nanoseconds()) / 1e3
	}
	for _, fam := range []string{"v4", "v6"} {
		for _, p := range []struct {
			name string
			q    float64
		}{{"p50", 0.5}, {"p99", 0.99}} {
			one, many := q(fam+"@1", p.q), q(fam+"@10000", p.q)
			b.ReportMetric(one, fam+"-"+p.name+"-us@1")
			b.ReportMetric(many, fam+"-"+p.name+"-us@10000")
			b.ReportMetric(many/one, fam+"-"+p.name+"-ratio")
		}
	}
	b.ReportMetric(0, "ns/op")
}

func vip4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}) }
func vip6(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd96::%x", i+1)) }

// timedConnect times a blocking connect() to to (the syscall only), then
// closes with RST.
func timedConnect(to netip.AddrPort) (time.Duration, error) {
	fam, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()})
	if to.Addr().Is4() {
		fam, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(to.Port()), Addr: to.Addr().As4()}
	}
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	start := time.Now()
	err = unix.Connect(fd, sa)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	return d, nil
}

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
