package bypass

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/podnet"
)

// TestBypassControlled: a veth stays idle for another owner's control on
// it, and (Kubernetes mode) for an endpoint of a pod with a bandwidth
// annotation; a pod without one, or on another veth, does not count.
func TestBypassControlled(t *testing.T) {
	b := &Node{}
	b.SetPods([]podnet.PodAddrs{
		{Namespace: "a", Name: "shaped", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.4")}, Bandwidth: "kubernetes.io/ingress-bandwidth=10M"},
		{Namespace: "a", Name: "plain", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}},
	})
	eps := map[netip.Addr]Endpoint{
		netip.MustParseAddr("10.0.0.4"): {Ifindex: 4},
		netip.MustParseAddr("10.0.0.5"): {Ifindex: 5},
	}
	for _, c := range []struct {
		ctl        podnet.Control
		ifx        int
		kind, what string
	}{
		{podnet.Control{}, 5, "", ""},
		{podnet.Control{}, 4, "bandwidth_annotation", "pod a/shaped has kubernetes.io/ingress-bandwidth=10M"},
		{podnet.Control{Kind: podnet.ControlQdisc, What: "tbf 1: parent root"}, 5, "qdisc", "qdisc: tbf 1: parent root"},
	} {
		why, kind := b.controlled(c.ctl, c.ifx, eps)
		if kind != c.kind || !strings.Contains(why, c.what) || (c.kind == "") != (why == "") {
			t.Errorf("ifindex %d, control %q: %q (%s), want kind %q naming %q", c.ifx, c.ctl, why, kind, c.kind, c.what)
		}
	}
}
