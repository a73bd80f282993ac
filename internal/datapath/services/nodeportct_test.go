package services

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNodePortUDPFlushesRemovedBackends: the UDP flows a NodePort sent to a
// backend that left it lose their conntrack entry (the next datagram picks
// a live backend), as kube-proxy's do; the flows to the backend that stays,
// TCP flows and another NodePort's UDP flows keep theirs. Deleting the
// NodePort flushes its UDP flows. Run with the real program in a throwaway
// namespace (progtest_test.go).
func TestNodePortUDPFlushesRemovedBackends(t *testing.T) {
	lb := ptLB(t)
	e := newPTNetNS(t)
	const port = 30055
	b1, b2 := netip.MustParseAddrPort("10.244.0.7:5353"), netip.MustParseAddrPort("10.244.0.8:5353")
	np := Frontend{Addr: netip.IPv4Unspecified(), Port: port, Proto: UDP, NodePort: true}
	set := func(tg Target) {
		t.Helper()
		if err := e.in(func() error { return lb.SetFrontend(np, tg) }); err != nil {
			t.Fatal(err)
		}
	}
	set(Target{Backends: []Backend{b1, b2}})
	var pkts [][]byte
	for i := range 32 { // both backends chosen: 1 - 2^-31
		pkts = append(pkts, ptPacket(ptZeroMAC, ptClient4, ptNode4, unix.IPPROTO_UDP, 0, ptUDP(uint16(42000+i), port, "q")))
	}
	others := [][]byte{
		ptPacket(ptZeroMAC, ptClient4, ptNode4, unix.IPPROTO_UDP, 0, ptUDP(43000, 30053, "q")),   // another NodePort
		ptPacket(ptZeroMAC, ptClient4, ptNode4, unix.IPPROTO_TCP, 0, ptTCP(43001, 30083, ptSYN)), // TCP
	}
	ptRunAll(t, lb, e, append(pkts, others...))
	count := func() (to1, to2, rest int) {
		for _, f := range e.flows(t) {
			switch {
			case strings.Contains(f, fmt.Sprintf(":%d ", port)) && strings.Contains(f, b1.String()):
				to1++
			case strings.Contains(f, fmt.Sprintf(":%d ", port)) && strings.Contains(f, b2.String()):
				to2++
			default:
				rest++
			}
		}
		return
	}
	to1, to2, rest := count()
	if to1 == 0 || to2 == 0 || to1+to2 != len(pkts) || rest != len(others) {
		t.Fatalf("before: %d flows to %s, %d to %s, %d others; want both used, %d in all, %d others:\n%s",
			to1, b1, to2, b2, rest, len(pkts), len(others), strings.Join(e.flows(t), "\n"))
	}
	set(Target{Backends: []Backend{b1}})
	if n1, n2, r := count(); n1 != to1 || n2 != 0 || r != rest {
		t.Errorf("%s removed: %d flows to %s (want %d), %d to %s (want 0), %d others (want %d)", b2, n1, b1, to1, n2, b2, r, rest)
	}
	if err := e.in(func() error { return lb.DeleteFrontend(np) }); err != nil {
		t.Fatal(err)
	}
	if n1, n2, r := count(); n1+n2 != 0 || r != rest {
		t.Errorf("NodePort deleted: %d flows left to its backends (want 0), %d others (want %d)", n1+n2, r, rest)
	}
	if fs := e.flows(t); !slices.ContainsFunc(fs, func(f string) bool { return strings.Contains(f, ":30053 ") }) {
		t.Errorf("the other NodePort's UDP flow went: %q", fs)
	}
}
