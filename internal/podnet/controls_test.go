package podnet

import (
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// TestControls: on a veth in a throwaway netns, the kernel's default qdisc
// is no control; a tbf at root (the bandwidth CNI plugin's
// ingress-bandwidth), a u32 filter at ingress (its egress-bandwidth
// mirred), another owner's tcx program are, each named; an ez_* tcx
// program is not; a receive-only check ignores the transmit side.
func TestControls(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestControls makes a netns and tc state: run go test as root")
	}
	ns, err := bpfsys.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	in := func(fn func() error) {
		t.Helper()
		if err := bpfsys.InNetNSHandle(ns, fn); err != nil {
			t.Fatal(err)
		}
	}
	var ifx int
	check := func(egress bool, kind, what string) {
		t.Helper()
		in(func() error {
			h, err := netlink.NewHandle()
			if err != nil {
				return err
			}
			defer h.Close()
			c, err := Controls(h, ifx, egress)
			if err != nil {
				return err
			}
			if c.Kind != kind || !strings.Contains(c.What, what) {
				t.Errorf("egress %v: control %q, want kind %q naming %q", egress, c, kind, what)
			}
			return nil
		})
	}
	in(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "v0"}, PeerName: "v1"}); err != nil {
			return err
		}
		lk, err := netlink.LinkByName("v0")
		if err != nil {
			return err
		}
		ifx = lk.Attrs().Index
		for _, n := range []string{"v0", "v1"} {
			l, _ := netlink.LinkByName(n)
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	check(true, "", "")

	nlDo := func(what string, fn func(h *netlink.Handle) error) {
		t.Helper()
		in(func() error {
			h, err := netlink.NewHandle()
			if err != nil {
				return err
			}
			defer h.Close()
			if err := fn(h); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			return nil
		})
	}
	const rate = 10_000_000 / 8
	tbf := &netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate: rate, Buffer: netlink.Xmittime(rate, 20000), Limit: 50000}
	nlDo("add tbf", func(h *netlink.Handle) error { return h.QdiscAdd(tbf) })
	check(true, ControlQdisc, "tbf 1:")
	check(false, "", "")
	nlDo("del tbf", func(h *netlink.Handle) error { return h.QdiscDel(tbf) })
	check(true, "", "")

	ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	nlDo("add ingress", func(h *netlink.Handle) error { return h.QdiscAdd(ingress) })
	check(true, "", "") // an empty ingress qdisc changes no packet's path
	nlDo("add u32", func(h *netlink.Handle) error {
		return h.FilterAdd(&netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifx, Parent: netlink.HANDLE_MIN_INGRESS, Priority: 7, Protocol: 0x0003},
			ClassId: netlink.MakeHandle(1, 1), Sel: &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: []netlink.TcU32Key{{}}}})
	})
	check(false, ControlFilter, "u32 filter prio 7 at ingress")
	nlDo("del ingress", func(h *netlink.Handle) error { return h.QdiscDel(ingress) })
	check(true, "", "")

	prog := func(name string) *ebpf.Program {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	for _, c := range []struct {
		name string
		at   ebpf.AttachType
		kind string
	}{{"ez_own", ebpf.AttachTCXIngress, ""}, {"other_owner", ebpf.AttachTCXEgress, ControlTCX}} {
		var l link.Link
		in(func() (err error) {
			l, err = link.AttachTCX(link.TCXOptions{Interface: ifx, Program: prog(c.name), Attach: c.at})
			return err
		})
		what := c.name
		if c.kind == "" {
			what = ""
		}
		check(true, c.kind, what)
		if c.kind != "" {
			check(false, "", "") // at egress: a receive-only check ignores it
		}
		l.Close()
	}
}
