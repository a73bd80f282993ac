package e2e

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// tcxProg is one program in a device's tcx chain.
type tcxProg struct {
	Dev  string
	Dir  string // "ingress" or "egress"
	Pos  int    // place in the chain, 0 first
	Name string
	ID   ebpf.ProgramID
}

// tcxChains lists the tcx programs of every device of the named netns
// (handle gives a netlink handle there).
func tcxChains(t *testing.T, netns string, handle func() (*netlink.Handle, error)) []tcxProg {
	t.Helper()
	h, err := handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []tcxProg
	err = bpfsys.InNetNS(netns, func() error {
		for _, lk := range links {
			for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				r, err := link.QueryPrograms(link.QueryOptions{Target: lk.Attrs().Index, Attach: at})
				if err != nil {
					return fmt.Errorf("query tcx %s on %s: %w", at, lk.Attrs().Name, err)
				}
				for i, pr := range r.Programs {
					p, err := ebpf.NewProgramFromID(pr.ID)
					if err != nil {
						continue // detached and freed meanwhile
					}
					info, err := p.Info()
					p.Close()
					if err != nil {
						return err
					}
					dir := "ingress"
					if at == ebpf.AttachTCXEgress {
						dir = "egress"
					}
					out = append(out, tcxProg{Dev: lk.Attrs().Name, Dir: dir, Pos: i, Name: info.Name, ID: pr.ID})
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
