package netlab

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ctFlow is a TCP conntrack entry src:1000 -> dst:2000, ESTABLISHED for
// nf_conntrack_tcp_timeout_established, as one whose FIN died with its veth.
func ctFlow(src, dst string) *netlink.ConntrackFlow {
	s, d := net.ParseIP(src), net.ParseIP(dst)
	fam := uint8(unix.AF_INET6)
	if s.To4() != nil { // netlink encodes a 16-byte IPv4 address as 0.0.0.0
		s, d, fam = s.To4(), d.To4(), unix.AF_INET
	}
	return &netlink.ConntrackFlow{
		FamilyType: fam,
		Forward:    netlink.IPTuple{SrcIP: s, DstIP: d, Protocol: unix.IPPROTO_TCP, SrcPort: 1000, DstPort: 2000},
		Reverse:    netlink.IPTuple{SrcIP: d, DstIP: s, Protocol: unix.IPPROTO_TCP, SrcPort: 2000, DstPort: 1000},
		TimeOut:    432000,
		ProtoInfo:  &netlink.ProtoInfoTCP{State: 3}, // TCP_CONNTRACK_ESTABLISHED
	}
}

// ctHas reports whether the host's conntrack table holds f's forward tuple.
func ctHas(t *testing.T, f *netlink.ConntrackFlow) bool {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.InetFamily(f.FamilyType))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range flows {
		if g.Forward.SrcIP.Equal(f.Forward.SrcIP) && g.Forward.DstIP.Equal(f.Forward.DstIP) &&
			g.Forward.SrcPort == f.Forward.SrcPort && g.Forward.DstPort == f.Forward.DstPort {
			return true
		}
	}
	return false
}

// TestConntrackFlushed: a lab's Close, and Sweep after its owner was killed,
// delete the host's conntrack entries of the lab's subnets and no other.
// Before this, `bench scale` left a million ESTABLISHED entries (their
// FINs died with the veths; 5 days' timeout) and wrote nf_conntrack_max back
// below the count: the host dropped every new flow ("table full").
func TestConntrackFlushed(t *testing.T) {
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_count"); err != nil {
		t.Fatalf("this test needs nf_conntrack loaded: %v", err)
	}
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	gone := strings.TrimSpace(string(b)) // no process has pid_max's pid
	// Outside every lab subnet: must survive, and is this test's to delete.
	outside := ctFlow("10.76.241.9", "10.76.241.10")
	t.Cleanup(func() {
		f := &netlink.ConntrackFilter{}
		f.AddIP(netlink.ConntrackOrigSrcIP, outside.Forward.SrcIP)
		f.AddIP(netlink.ConntrackOrigDstIP, outside.Forward.DstIP)
		netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
	})
	for _, killed := range []bool{false, true} {
		lab, err := New("ctfl", 241)
		if err != nil {
			t.Fatal(err)
		}
		inside := []*netlink.ConntrackFlow{
			ctFlow("10.77.241.2", "10.77.241.3"),
			ctFlow("10.76.241.9", "10.77.241.3"), // only its destination in the lab
			ctFlow("fd77:241::2", "fd77:241::3"),
		}
		for _, f := range append(inside, outside) {
			if err := netlink.ConntrackCreate(netlink.ConntrackTable, netlink.InetFamily(f.FamilyType), f); err != nil && !(f == outside && killed) {
				lab.Close()
				t.Fatalf("create %v: %v", f.Forward, err)
			}
			if !ctHas(t, f) {
				lab.Close()
				t.Fatalf("created %v, not listed", f.Forward)
			}
		}
		if killed {
			// The owner record now names a gone process: Sweep's case.
			path := filepath.Join(ownerDir, lab.Name)
			rec, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, rest, _ := strings.Cut(string(rec), "\n")
			if err := os.WriteFile(path, []byte(gone+"\n"+rest), 0o600); err != nil {
				t.Fatal(err)
			}
			err = Sweep()
		} else {
			err = lab.Close()
		}
		if err != nil {
			t.Fatalf("killed %v: %v", killed, err)
		}
		for _, f := range inside {
			if ctHas(t, f) {
				t.Errorf("killed %v: %v still tracked after the lab went", killed, f.Forward)
			}
		}
		if !ctHas(t, outside) {
			t.Errorf("killed %v: %v (not the lab's) was deleted", killed, outside.Forward)
		}
	}
}
