package multinode

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestOptionsDefaults(t *testing.T) {
	o := Options{Name: "mn"}
	if err := o.fill(); err != nil {
		t.Fatal(err)
	}
	if o.Nodes != 2 || o.Mode != HostGW || o.UnderlayMTU != 1500 || o.PodMTU != 1500 || o.ForwardPolicy != "DROP" {
		t.Errorf("defaults: %+v", o)
	}
	v := Options{Name: "mn", Mode: VXLAN}
	if err := v.fill(); err != nil {
		t.Fatal(err)
	}
	if v.PodMTU != 1450 {
		t.Errorf("VXLAN pod MTU %d, want 1450 (a CNI's: underlay - 50)", v.PodMTU)
	}
}

func TestOptionsRejected(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{}, "name"},
		{Options{Name: "toolong7"}, "name"},
		{Options{Name: "a-b"}, "name"},
		{Options{Name: "mn", Nodes: -1}, "nodes"},
		{Options{Name: "mn", Nodes: MaxNodes + 1}, "nodes"},
		{Options{Name: "mn", Mode: "ipip"}, "mode"},
		{Options{Name: "mn", UnderlayMTU: 1279}, "underlay MTU"},
		{Options{Name: "mn", Mode: VXLAN, UnderlayMTU: 1300}, "underlay MTU"},
		{Options{Name: "mn", PodMTU: 9001}, "pod MTU"},
		{Options{Name: "mn", ForwardPolicy: "REJECT"}, "FORWARD policy"},
	} {
		err := c.o.fill()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %s", c.o, err, c.want)
		}
	}
}

// The longest names the limits allow fit IFNAMSIZ.
func TestLinkNamesFit(t *testing.T) {
	for _, what := range []string{"ulbr", "ext", fmt.Sprintf("%dbr", MaxNodes), fmt.Sprintf("%dvx", MaxNodes),
		fmt.Sprintf("%dup", MaxNodes), fmt.Sprintf("%dp%d", MaxNodes, MaxPodsPerNode)} {
		if n := linkName("abcdef", what); len(n) > 15 {
			t.Errorf("%s: %d bytes", n, len(n))
		}
	}
}

func TestNth(t *testing.T) {
	for _, c := range []struct {
		p    string
		k    int
		want string
	}{{"10.88.3.0/24", 2, "10.88.3.2"}, {"10.96.0.0/16", 300, "10.96.1.44"}, {"fd88:0:3::/64", 0xfe, "fd88:0:3::fe"}, {"fd89::/64", 1, "fd89::1"}} {
		if got := nth(netip.MustParsePrefix(c.p), c.k); got.String() != c.want {
			t.Errorf("nth(%s, %d) = %s, want %s", c.p, c.k, got, c.want)
		}
	}
	n4 := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 88, 7, 0}), 24)
	if !ClusterV4.Contains(n4.Addr()) || !ClusterV6.Contains(netip.MustParseAddr("fd88:0:32::2")) {
		t.Errorf("node CIDRs outside the cluster CIDRs")
	}
}
