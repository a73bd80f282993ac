package shortcut

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// Coverage (bpf/shortcut/coverage.h): ez_sc_netns_covered holds the network
// namespaces whose loopback carries ez_sc_close_reset, so sockops can count
// a socket enrolled before its namespace's was attached (the RST on close's
// one gap) and ask for that namespace in ez_sc_netns_wanted. The agent
// answers by attaching the loopbacks at once (CoverageWanted) instead of at
// its next scan of the managed cgroups' processes.

// coveredNetNS are the cookies of the namespaces whose loopback this
// process holds the close reset on (its tcx links or legacy tc filters).
func (s *Shortcut) coveredNetNS() map[uint64]bool {
	out := map[uint64]bool{}
	base := bpfsys.LinkPin(s.dir, bpfsys.KindTCX)
	for pin := range s.devLinks {
		rel, err := filepath.Rel(base, pin)
		parts := strings.Split(rel, string(filepath.Separator))
		if err != nil || len(parts) != 3 || parts[1] != strconv.Itoa(loopbackIfindex) || parts[2] != resetProg+"_egress" {
			continue
		}
		if c, err := strconv.ParseUint(parts[0], 10, 64); err == nil {
			out[c] = true
		}
	}
	for rec := range s.devFilters {
		c, f, err := bpfsys.ParseTCRecord(rec)
		if err == nil && f.Ifindex == loopbackIfindex && !f.Ingress && f.Name == resetFilterName {
			out[c] = true
		}
	}
	return out
}

// SyncCoverage makes ez_sc_netns_covered hold the namespaces whose loopback
// this process holds the close reset on, then turns counting and asking on
// (once the map is right, so a fresh load counts nothing it has not
// checked). Call it after the device links changed (a committed
// SyncDevices or SyncLoopbacks).
func (s *Shortcut) SyncCoverage() error {
	if s.objs.EzScCloseReset == nil {
		return nil // RST on close is off on this kernel: nothing to count
	}
	want := s.coveredNetNS()
	m := s.objs.EzScNetnsCovered
	var stale []uint64
	var k, v uint64
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", shortcutMapEzScNetnsCovered, err)
	}
	for _, c := range stale {
		if err := m.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", shortcutMapEzScNetnsCovered, err)
		}
	}
	for c := range want {
		if err := m.Put(c, uint64(1)); err != nil {
			return fmt.Errorf("update %s: %w", shortcutMapEzScNetnsCovered, err)
		}
	}
	if err := s.objs.EzNetnsCoverage.Set(uint32(1)); err != nil {
		return fmt.Errorf("turn coverage on: %w", err)
	}
	return nil
}

// CoverageWanted takes the namespaces sockops asked for (their first
// handshakes found them uncovered) out of ez_sc_netns_wanted, leaving those
// covered meanwhile out.
func (s *Shortcut) CoverageWanted() ([]uint64, error) {
	if s.objs.EzScCloseReset == nil {
		return nil, nil
	}
	m := s.objs.EzScNetnsWanted
	var keys []uint64
	var k, v uint64
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", shortcutMapEzScNetnsWanted, err)
	}
	covered := s.coveredNetNS()
	var out []uint64
	for _, c := range keys {
		if err := m.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, fmt.Errorf("delete from %s: %w", shortcutMapEzScNetnsWanted, err)
		}
		if !covered[c] {
			out = append(out, c)
		}
	}
	return out, nil
}

// CoveredOnly tells whether sockets enrol only in covered namespaces:
// Config.CoveredOnly where the close reset runs.
func (s *Shortcut) CoveredOnly() bool { return s.coveredOnly }

// CgroupFilter tells whether only the cgroups SetScope selected enrol (Config.CgroupFilter).
func (s *Shortcut) CgroupFilter() bool { return s.cgroupFilter }

// PinnedDevice tells whether the close reset is pinned on the device with
// ifindex of the network namespace with cookie, in that direction (by this
// agent or an earlier one).
func (s *Shortcut) PinnedDevice(cookie uint64, ifindex int, ingress bool) bool {
	dir := devAttaches[1]
	if ingress {
		dir = devAttaches[0]
	}
	if !bpfsys.UseTCX() {
		return bpfsys.Exists(bpfsys.TCRecord(s.dir, cookie, resetFilter(Device{Ifindex: ifindex}, dir)))
	}
	return bpfsys.Exists(s.resetLinkPin(cookie, ifindex, dir))
}

// EnrolledNetNS are the inode numbers of the network namespaces that have an
// end in the sockhash, from the connection index (bpf/shortcut/index.h).
func (s *Shortcut) EnrolledNetNS() (map[uint32]bool, error) {
	out := map[uint32]bool{}
	if err := batchWalk(s.objs.EzScIndex, func(_ *uint64, ix *shortcutEzConnIndex) { out[ix.NetnsIno] = true }); err != nil {
		return nil, fmt.Errorf("read %s: %w", shortcutMapEzScIndex, err)
	}
	return out, nil
}
