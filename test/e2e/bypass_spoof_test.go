package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath/bypass"
	"github.com/eztunnel/eztunnel/internal/testpacket"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// TestBypassSpoofedSource plays a pod with NET_RAW on the node of a
// bypassed flow: a3 and a2 exchange UDP (admitted both ways, bypassed),
// and a1 injects datagrams of that flow with a3's address as source, once
// with its own MAC and once with a3's. The node has a bridge-family nft
// anti-spoofing rule on a1's port (as a CNI installs: source MAC and IP
// must be a1's), at prerouting so a forged MAC is not learnt. The forged
// datagrams must take the bridge (the bypass's fallback_spoofed_source
// counts them, the rule drops them) and never reach a2's socket; the
// honest flow stays bypassed.
func TestBypassSpoofedSource(t *testing.T) {
	if err := bypass.ProbeKernel(); err != nil {
		t.Fatalf("the bypass cannot run here: %v", err)
	}
	l := newMultinode(t, multinode.Options{Name: "mnsp", Nodes: 1})
	n := l.Node(1)
	a1, a2, a3 := mnPod(t, n, "a1"), mnPod(t, n, "a2"), mnPod(t, n, "a3")
	setBeLiberal(t, n, "1")
	bp := attachBypass(t, n, bypass.Config{})

	mac := func(p *multinode.Pod) net.HardwareAddr {
		t.Helper()
		h, err := p.Handle()
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		eth, err := h.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		return eth.Attrs().HardwareAddr
	}
	mac1, mac2, mac3 := mac(a1), mac(a2), mac(a3)

	// The honest flow a3:5301 <-> a2:5302.
	srv, cli := netip.AddrPortFrom(a2.IPv4, 5302), netip.AddrPortFrom(a3.IPv4, 5301)
	var c2, c3 *net.UDPConn
	if err := a2.Do(func() (err error) { c2, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(srv)); return err }); err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := a3.Do(func() (err error) {
		c3, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(cli), net.UDPAddrFromAddrPort(srv))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	buf := make([]byte, 2048)
	roundTrip := func(msg string) {
		t.Helper()
		if _, err := c3.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		c2.SetReadDeadline(time.Now().Add(scaled(5 * time.Second)))
		k, from, err := c2.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:k]) != msg || from != cli {
			t.Fatalf("a2 read %q from %v (%v), want %q from %v", buf[:k], from, err, msg, cli)
		}
		if _, err := c2.WriteToUDPAddrPort([]byte("re:"+msg), cli); err != nil {
			t.Fatal(err)
		}
		c3.SetReadDeadline(time.Now().Add(scaled(5 * time.Second)))
		if k, err = c3.Read(buf); err != nil || string(buf[:k]) != "re:"+msg {
			t.Fatalf("a3 read %q (%v)", buf[:k], err)
		}
	}
	before := bpCounters(t, bp)
	for i := range 5 {
		roundTrip(fmt.Sprintf("honest-%d", i))
	}
	if d := bpDelta(before, bpCounters(t, bp)); d["bypassed_packets"] == 0 {
		t.Fatalf("the honest flow is not bypassed: %v", d)
	}

	// The CNI's anti-spoofing on a1's port (the netns goes with the lab).
	ns, err := netns.GetFromName(n.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nc, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	tb := nc.AddTable(&nftables.Table{Family: nftables.TableFamilyBridge, Name: "ezt_antispoof"})
	prio := nftables.ChainPriority(-300)
	ch := nc.AddChain(&nftables.Chain{Name: "pre", Table: tb, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: &prio})
	ifname := make([]byte, 16)
	copy(ifname, a1.HostVeth)
	iif := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname}}
	// iifname <a1's port> ether saddr != <a1's MAC> counter drop
	nc.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: append(slices.Clone(iif),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: mac1},
		&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})})
	// iifname <a1's port> ether type ip ip saddr != <a1's IPv4> counter drop
	nc.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: append(slices.Clone(iif),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x08, 0x00}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: a1.IPv4.AsSlice()},
		&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})})
	if err := nc.Flush(); err != nil {
		t.Fatalf("nftables bridge anti-spoofing rules in %s: %v", n.Name, err)
	}
	dropped := func() (sum uint64) {
		t.Helper()
		rs, err := nc.GetRules(tb, ch)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			for _, e := range r.Exprs {
				if c, ok := e.(*expr.Counter); ok {
					sum += c.Packets
				}
			}
		}
		return sum
	}

	// a1 forges datagrams of the flow (UDP checksum 0: none, for IPv4).
	const forged = 20
	frame := func(src net.HardwareAddr, i int) []byte {
		l4 := testpacket.UDP(cli.Port(), srv.Port(), []byte(fmt.Sprintf("FORGED-%d", i)))
		l3 := testpacket.IPv4{Src: a3.IPv4.String(), Dst: a2.IPv4.String(), Proto: unix.IPPROTO_UDP, TTL: 64, ID: uint16(i)}.Packet(l4)
		return testpacket.Eth(mac2, src, 0x0800, l3)
	}
	before = bpCounters(t, bp)
	if err := a1.Do(func() error {
		eth, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Ifindex: eth.Index, Protocol: htons(unix.ETH_P_IP), Halen: 6}
		copy(to.Addr[:], mac2)
		for i := range forged {
			src := mac1 // a3's address, a1's MAC
			if i%2 == 1 {
				src = mac3 // and a3's MAC
			}
			if err := unix.Sendto(fd, frame(src, i), 0, to); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Whatever arrives at a2 within a second.
	got := 0
	c2.SetReadDeadline(time.Now().Add(scaled(time.Second)))
	for {
		k, _, err := c2.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		if strings.HasPrefix(string(buf[:k]), "FORGED") {
			got++
		}
	}
	d := bpDelta(before, bpCounters(t, bp))
	t.Logf("forged %d datagrams: %d delivered to a2; the bridge rule dropped %d; bypass: spoofed_source %d, bypassed %d",
		forged, got, dropped(), d["fallback_spoofed_source"], d["bypassed_packets"])
	if got != 0 {
		t.Errorf("%d of %d forged datagrams reached a2's socket, want none (the bridge's anti-spoofing rule drops them)", got, forged)
	}
	if n := dropped(); n < forged {
		t.Errorf("the bridge's anti-spoofing rule saw %d of %d forged frames", n, forged)
	}
	if d["fallback_spoofed_source"] < forged {
		t.Errorf("fallback_spoofed_source %d, want >= %d", d["fallback_spoofed_source"], forged)
	}
	// The honest flow carries on, bypassed.
	before = bpCounters(t, bp)
	for i := range 3 {
		roundTrip(fmt.Sprintf("honest-again-%d", i))
	}
	if d := bpDelta(before, bpCounters(t, bp)); d["bypassed_packets"] < 6 {
		t.Errorf("the honest flow after the attack: %v, want its 6 datagrams bypassed", d)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
