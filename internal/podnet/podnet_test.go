package podnet

import (
	"net"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestLinkDown(t *testing.T) {
	for _, c := range []struct {
		attrs netlink.LinkAttrs
		down  bool
	}{
		{netlink.LinkAttrs{Flags: net.FlagUp, OperState: netlink.OperUp}, false},
		{netlink.LinkAttrs{Flags: net.FlagUp, OperState: netlink.OperUnknown}, false}, // VXLAN: no carrier reporting
		{netlink.LinkAttrs{OperState: netlink.OperUp}, true},                          // administratively down
		{netlink.LinkAttrs{Flags: net.FlagUp, OperState: netlink.OperDown}, true},
		{netlink.LinkAttrs{Flags: net.FlagUp, OperState: netlink.OperLowerLayerDown}, true}, // a veth whose peer is down
	} {
		if got := linkDown(&c.attrs); (got != "") != c.down {
			t.Errorf("flags %v oper %v: %q, want down %v", c.attrs.Flags, c.attrs.OperState, got, c.down)
		}
	}
}
