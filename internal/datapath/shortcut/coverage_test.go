package shortcut

import (
	"maps"
	"slices"
	"testing"

	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// TestCoveredNetNS: only the loopback's egress link or legacy filter makes a
// namespace covered; a veth's, an ingress one, another program's do not.
func TestCoveredNetNS(t *testing.T) {
	dir := "/sys/fs/bpf/x/v2"
	s := &Shortcut{dir: dir, devLinks: map[string]link.Link{}, devFilters: map[string]bool{}}
	tcx := func(parts ...string) string { return bpfsys.LinkPin(dir, bpfsys.KindTCX, parts...) }
	for _, pin := range []string{
		tcx("11", "1", resetProg+"_egress"),                                    // covered
		tcx("12", "7", resetProg+"_ingress"),                                   // a veth: no
		tcx("13", "1", resetProg+"_ingress"),                                   // lo, ingress: no
		tcx("14", "1", "ez_other_egress"),                                      // another program: no
		tcx("x", "1", resetProg+"_egress"),                                     // not a cookie: no
		bpfsys.LinkPin(dir, bpfsys.KindCgroup, "15", "1", resetProg+"_egress"), // not tcx: no
	} {
		s.devLinks[pin] = nil
	}
	lo := func(c uint64, ingress bool, name string) string {
		return bpfsys.TCRecord(dir, c, bpfsys.TCFilter{Ifindex: loopbackIfindex, Ingress: ingress, Name: name})
	}
	s.devFilters[lo(21, false, resetFilterName)] = true // covered
	s.devFilters[lo(22, true, resetFilterName)] = true  // ingress: no
	s.devFilters[bpfsys.TCRecord(dir, 23, bpfsys.TCFilter{Ifindex: 5, Name: resetFilterName})] = true
	got := slices.Sorted(maps.Keys(s.coveredNetNS()))
	if want := []uint64{11, 21}; !slices.Equal(got, want) {
		t.Errorf("covered %v, want %v", got, want)
	}
}
