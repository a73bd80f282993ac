package e2e

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// tcxProg is one program in a device's tcx chain, or a legacy tc filter
// (kernels without tcx, or EZTUNNEL_TEST_LEGACY_TC=1: Legacy, Pos its place
// by priority among the filters of its hook).
type tcxProg struct {
	Dev    string
	Dir    string // "ingress" or "egress"
	Pos    int    // place in the chain, 0 first
	Name   string
	ID     ebpf.ProgramID
	Legacy bool
}

// tcxChains lists the tcx programs and the legacy tc BPF filters of every
// device of the named netns (handle gives a netlink handle there).
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
				if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
					continue // no tcx on this kernel (6.1 answers EINVAL)
				}
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
			for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
				fs, err := h.FilterList(lk, parent)
				if err != nil {
					continue // no clsact qdisc
				}
				slices.SortStableFunc(fs, func(a, b netlink.Filter) int { return int(a.Attrs().Priority) - int(b.Attrs().Priority) })
				dir := "ingress"
				if parent == netlink.HANDLE_MIN_EGRESS {
					dir = "egress"
				}
				for i, f := range fs {
					if b, ok := f.(*netlink.BpfFilter); ok {
						out = append(out, tcxProg{Dev: lk.Attrs().Name, Dir: dir, Pos: i, Name: b.Name, ID: ebpf.ProgramID(b.Id), Legacy: true})
					}
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
