package shortcut

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/rtnl"
)

// Adoption puts connections established before the agent on the shortcut
// (bpf/shortcut/adopt.h has the protocol). One round: scan every given
// network namespace, match the ends, then run the step iterator over them
// three times (confirm, insert, finish). Rounds must not overlap: the agent
// runs them from its loop only.

// AdoptReport is what one round did.
type AdoptReport struct {
	Namespaces int      `json:"namespaces"`
	Denied     int      `json:"processes_denied,omitempty"` // processes whose namespace could not be opened (no CAP_SYS_PTRACE, another PID namespace)
	Sockets    int      `json:"sockets"`                    // established sockets under the hooks
	Candidates int      `json:"candidates"`                 // matched pairs tried
	Adopted    uint64   `json:"adopted"`
	Skipped    Counters `json:"skipped"` // by reason, this round
	// Busy counts the scanned sockets by what made them busy (a socket may
	// count under several causes): unacked, unread, queued, sleeper, closing, unsupported.
	Busy map[string]int `json:"busy,omitempty"`
	// NATRead: the round read the namespaces' conntrack tables, which it
	// does only with an established adoptable socket to match.
	NATRead bool          `json:"nat_read"`
	Took    time.Duration `json:"took_ns"`
}

// adoptCounters names enum ez_adopt_counter.
var adoptCounters = bpfsys.CounterSet[shortcutEzAdoptCounter]{Max: shortcutEzAdoptCounterEZ_A_MAX, Names: map[shortcutEzAdoptCounter]string{
	shortcutEzAdoptCounterEZ_A_ROUNDS:           "adopt_rounds",
	shortcutEzAdoptCounterEZ_A_ADOPTED:          "adopted",
	shortcutEzAdoptCounterEZ_A_SKIP_BUSY:        "adopt_skipped_busy",
	shortcutEzAdoptCounterEZ_A_SKIP_NO_PEER:     "adopt_skipped_no_peer",
	shortcutEzAdoptCounterEZ_A_SKIP_NAT_UNKNOWN: "adopt_skipped_nat_unknown",
	shortcutEzAdoptCounterEZ_A_SKIP_EXCLUDED:    "adopt_skipped_excluded",
	shortcutEzAdoptCounterEZ_A_SKIP_AMBIGUOUS:   "adopt_skipped_ambiguous",
	shortcutEzAdoptCounterEZ_A_SKIP_UNSUPPORTED: "adopt_skipped_unsupported",
	shortcutEzAdoptCounterEZ_A_LATE_STACK:       "adopt_late_stack",
	shortcutEzAdoptCounterEZ_A_SKIP_UNCOVERED:   "adopt_skipped_uncovered",
}}

// AdoptCounterNames lists the adoption counters in enum order.
func AdoptCounterNames() []string { return adoptCounters.List() }

// ReadAdoptCounters sums the per-CPU adoption counters.
func ReadAdoptCounters(m *ebpf.Map) (Counters, error) { return adoptCounters.Read(m) }

// addAdoptCounter adds n to CPU 0's slot: the agent is the only userspace writer.
func addAdoptCounter(m *ebpf.Map, c shortcutEzAdoptCounter, n uint64) error {
	if n == 0 {
		return nil
	}
	var perCPU []uint64
	if err := m.Lookup(uint32(c), &perCPU); err != nil {
		return err
	}
	perCPU[0] += n
	return m.Update(uint32(c), perCPU, ebpf.UpdateExist)
}

// SetAdoptHooks records the cgroups ez_sc_sockops is attached to: adoption
// considers only sockets below them (their callbacks are the tripwire).
func (s *Shortcut) SetAdoptHooks(ids []uint64) error {
	want := map[uint64]bool{}
	for _, id := range ids {
		want[id] = true
		if err := s.objs.EzScAdoptHooks.Update(id, uint32(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("adopt hooks: %w", err)
		}
	}
	var id uint64
	var v uint32
	var stale []uint64
	it := s.objs.EzScAdoptHooks.Iterate()
	for it.Next(&id, &v) {
		if !want[id] {
			stale = append(stale, id)
		}
	}
	for _, id := range stale {
		s.objs.EzScAdoptHooks.Delete(id)
	}
	return it.Err()
}

// inNetNS runs fn on a thread in the namespace of the nsfs file path.
func inNetNS(path string, fn func() error) error {
	return bpfsys.InNetNSPath(path, fn)
}

func (s *Shortcut) adoptIters() error {
	if s.adoptScan == nil {
		it, err := link.AttachIter(link.IterOptions{Program: s.objs.EzScAdoptScan})
		if err != nil {
			return fmt.Errorf("attach adoption scan iterator: %w", err)
		}
		s.adoptScan = it
	}
	if s.adoptStep == nil {
		it, err := link.AttachIter(link.IterOptions{Program: s.objs.EzScAdoptStep})
		if err != nil {
			return fmt.Errorf("attach adoption step iterator: %w", err)
		}
		s.adoptStep = it
	}
	return nil
}

// runIn opens the iterator inside the namespace (iter/tcp binds to the
// opener's netns) and reads it to the end.
func runIn(it *link.Iter, path string, out func(io.Reader) error) error {
	var rd io.ReadCloser
	if err := inNetNS(path, func() error {
		var err error
		rd, err = it.Open()
		return err
	}); err != nil {
		return err
	}
	defer rd.Close()
	return out(rd)
}

// scanIn hands every record of the namespace's adoption scan to fn.
func scanIn(it *link.Iter, path string, fn func(*shortcutEzAdoptSock) error) error {
	return runIn(it, path, func(r io.Reader) error {
		if err := readRecords(bufio.NewReader(r), fn); err != nil {
			return fmt.Errorf("read adoption scan: %w", err)
		}
		return nil
	})
}

// conntrackIn lists the NAT-ed TCP entries of the namespace at path.
func conntrackIn(path string, cookie uint64) ([]ctFlow, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := rtnl.ConntrackAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	var out []ctFlow
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return nil, fmt.Errorf("conntrack: %w", err)
		}
		for _, f := range flows {
			if f.Forward.Protocol != unix.IPPROTO_TCP {
				continue
			}
			c := ctFlow{netns: cookie,
				origSrc:  addrPort(f.Forward.SrcIP, f.Forward.SrcPort),
				origDst:  addrPort(f.Forward.DstIP, f.Forward.DstPort),
				replySrc: addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort),
				replyDst: addrPort(f.Reverse.DstIP, f.Reverse.DstPort),
			}
			if c.origDst == c.replySrc && c.origSrc == c.replyDst {
				continue // not NAT-ed
			}
			out = append(out, c)
		}
	}
	return out, nil
}

func addrPort(ip []byte, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// Adopt runs one adoption round over the network namespaces (nsfs paths,
// one per namespace).
func (s *Shortcut) Adopt(namespaces []string) (AdoptReport, error) {
	start := time.Now()
	rep := AdoptReport{Namespaces: len(namespaces), Skipped: Counters{}}
	if err := s.adoptIters(); err != nil {
		return rep, err
	}
	before, err := ReadAdoptCounters(s.objs.EzScAdoptCounters)
	if err != nil {
		return rep, err
	}
	// Records left by a round that was interrupted (agent killed): a
	// finishing pass first settles the unsettled end of every pair that was
	// activated (deleting its record first would make the next pass hand
	// back, and so break, a live pair) and hands back the rest; then they go.
	var k uint64
	if err := s.objs.EzScAdopts.NextKey(nil, &k); err == nil {
		s.adoptSettled = false
		if _, err := s.stepAll(namespaces, true); err != nil {
			return rep, err
		}
	}
	if err := purge(s.objs.EzScAdopts); err != nil {
		return rep, err
	}
	if err := purge(s.objs.EzScAdoptSocks); err != nil {
		return rep, err
	}
	cands, sk, errs := s.candidates(namespaces, &rep)
	// Agent-decided skips are counted now; BPF counts the rest.
	for c, n := range map[shortcutEzAdoptCounter]uint64{
		shortcutEzAdoptCounterEZ_A_SKIP_BUSY:        sk.busy,
		shortcutEzAdoptCounterEZ_A_SKIP_NO_PEER:     sk.noPeer,
		shortcutEzAdoptCounterEZ_A_SKIP_NAT_UNKNOWN: sk.natUnknown,
		shortcutEzAdoptCounterEZ_A_SKIP_AMBIGUOUS:   sk.ambiguous,
		shortcutEzAdoptCounterEZ_A_SKIP_UNSUPPORTED: sk.unsupported,
	} {
		if err := addAdoptCounter(s.objs.EzScAdoptCounters, c, n); err != nil {
			errs = append(errs, err)
		}
	}
	var written []adoptCandidate
	for _, c := range cands {
		if err := s.writeCandidate(&c); err != nil {
			continue // an end is in another record already (a concurrent round)
		}
		written = append(written, c)
	}
	rep.Candidates = len(written)
	// Pass 1 confirms, pass 2 inserts (the second end activates), pass 3
	// settles the first end, or aborts and hands back whatever is not
	// paired. Namespaces without a candidate still get a pass: leftovers of
	// an interrupted round are handed back there. A round with no candidate
	// after a settled one has none to step: each pass visits every socket
	// of every namespace (3 passes were 2/3 of a round's CPU at 300k idle
	// connections), so it skips them.
	if len(written) > 0 || !s.adoptSettled {
		settled := true
		for pass := range min(3, s.adoptPasses) {
			complete, err := s.stepAll(namespaces, pass == 2)
			settled = settled && complete
			if err != nil {
				errs = append(errs, err)
				settled = false
				break
			}
		}
		s.adoptSettled = settled && s.adoptPasses >= 3
	}
	if s.adoptPasses < 3 {
		return rep, errors.Join(errs...) // interrupted on purpose (tests): records stay
	}
	for _, c := range written {
		s.objs.EzScAdopts.Delete(c.ends[0].rec.Cookie)
		s.objs.EzScAdoptSocks.Delete(c.ends[0].rec.Cookie)
		s.objs.EzScAdoptSocks.Delete(c.ends[1].rec.Cookie)
	}
	// Counted last: `eztunnel adopt` waits for it to read the round's counters.
	if err := addAdoptCounter(s.objs.EzScAdoptCounters, shortcutEzAdoptCounterEZ_A_ROUNDS, 1); err != nil {
		errs = append(errs, err)
	}
	after, err := ReadAdoptCounters(s.objs.EzScAdoptCounters)
	if err != nil {
		errs = append(errs, err)
	}
	for name, v := range after {
		if name == "adopt_rounds" || name == "adopt_late_stack" {
			continue
		}
		if d := v - before[name]; d > 0 {
			if name == "adopted" {
				rep.Adopted = d
			} else {
				rep.Skipped[name] = d
			}
		}
	}
	rep.Took = time.Since(start)
	return rep, errors.Join(errs...)
}

// candidates scans every namespace and matches the pairs a round tries,
// recording the scan's counts in rep. A first scan counts and keeps
// nothing: a round with no established adoptable socket (every idle round
// of a node whose connections are accelerated) stops there. Only a round
// with one keeps every scanned socket (its peer and any look-alike must be
// seen) and reads the NAT.
func (s *Shortcut) candidates(namespaces []string, rep *AdoptReport) ([]adoptCandidate, adoptSkips, []error) {
	var counter busyCounter
	_, errs := s.scanAll(namespaces, func(_ string, rec *shortcutEzAdoptSock) { counter.add(rec) })
	rep.Sockets, rep.Busy = counter.sockets, counter.busy
	if rep.Sockets == 0 { // none established and adoptable: no candidate, no skip
		return nil, adoptSkips{}, errs
	}
	var socks []scanSock
	cookies := map[string]uint64{} // each namespace's, from its first socket
	scanned, errs := s.scanAll(namespaces, func(p string, rec *shortcutEzAdoptSock) {
		if _, ok := cookies[p]; !ok {
			cookies[p] = rec.NetnsCookie
		}
		socks = append(socks, newScanSock(*rec))
	})
	flows, ctErrs := conntrackAll(scanned, cookies)
	rep.NATRead = true
	cands, sk := matchAdoption(socks, flows)
	return cands, sk, append(errs, ctErrs...)
}

// scanAll runs the adoption scan in every namespace, handing each record
// and its namespace to fn, and returns the namespaces it scanned; a
// namespace that cannot be read is an error, the others are scanned.
func (s *Shortcut) scanAll(namespaces []string, fn func(ns string, rec *shortcutEzAdoptSock)) (scanned []string, errs []error) {
	for _, p := range namespaces {
		err := scanIn(s.adoptScan, p, func(rec *shortcutEzAdoptSock) error {
			fn(p, rec)
			return nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("scan %s: %w", p, err))
			continue
		}
		scanned = append(scanned, p)
	}
	return scanned, errs
}

// conntrackAll reads the NAT-ed TCP entries of the scanned namespaces,
// also where no managed socket lives (the node's: kube-proxy). Loopback
// entries matter only where sockets are, and carry that namespace's cookie
// (0 where it has none). Only for a round with an established adoptable
// socket: a node's table holds every bridged flow, and the dump is
// materialized.
func conntrackAll(scanned []string, cookies map[string]uint64) (flows []ctFlow, errs []error) {
	for _, p := range scanned {
		ct, err := conntrackIn(p, cookies[p])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
		flows = append(flows, ct...)
	}
	return flows, errs
}

// busyNames name the reasons an established socket cannot be adopted now.
var busyNames = map[shortcutEzAdoptBusy]string{
	shortcutEzAdoptBusyEZ_AB_UNACKED: "unacked", shortcutEzAdoptBusyEZ_AB_UNREAD: "unread",
	shortcutEzAdoptBusyEZ_AB_QUEUED: "queued", shortcutEzAdoptBusyEZ_AB_SLEEPER: "sleeper",
	shortcutEzAdoptBusyEZ_AB_CLOSING: "closing", shortcutEzAdoptBusyEZ_AB_UNSUPPORTED: "unsupported",
	shortcutEzAdoptBusyEZ_AB_SACK: "sack",
}

// busyCounter counts the established adoptable sockets and, by reason,
// those busy (busy nil: none).
type busyCounter struct {
	sockets int
	busy    map[string]int
}

func (c *busyCounter) add(rec *shortcutEzAdoptSock) {
	if s := (scanSock{rec: *rec}); !s.established() || !adoptable(&s) {
		return
	}
	c.sockets++
	for bit, name := range busyNames {
		if rec.Busy&uint32(bit) != 0 {
			if c.busy == nil {
				c.busy = map[string]int{}
			}
			c.busy[name]++
		}
	}
}

// stepAll runs ez_sc_adopt_step once over every namespace; finish aborts and
// hands back whatever is not paired. A namespace that is gone (its
// processes exited) is skipped; complete is false then.
func (s *Shortcut) stepAll(namespaces []string, finish bool) (complete bool, err error) {
	v := uint32(0)
	if finish {
		v = 1
	}
	if err := s.objs.EzAdoptFinish.Set(v); err != nil {
		return false, err
	}
	defer s.objs.EzAdoptFinish.Set(uint32(0))
	complete = true
	for _, p := range namespaces {
		if err := runIn(s.adoptStep, p, func(r io.Reader) error {
			_, err := io.Copy(io.Discard, r)
			return err
		}); err != nil {
			complete = false
		}
	}
	return complete, nil
}

// InterruptAdoptionAfter makes the next rounds stop after passes step
// passes (1: confirm, 2: insert), leaving their records as an agent killed
// there would: for tests of the next round's recovery. 3 or more: whole rounds.
func (s *Shortcut) InterruptAdoptionAfter(passes int) { s.adoptPasses = passes }

// writeCandidate publishes a matched pair (CANDIDATE) for the step iterator.
func (s *Shortcut) writeCandidate(c *adoptCandidate) error {
	conn := c.ends[0].rec.Cookie
	rec := shortcutEzAdopt{
		Cookie: [2]uint64{c.ends[0].rec.Cookie, c.ends[1].rec.Cookie},
		Key:    c.key,
		State:  uint32(shortcutEzAdoptStateEZ_ADOPT_CANDIDATE),
	}
	// The record first, then the index: the step finds nothing until both exist.
	if err := s.objs.EzScAdopts.Update(conn, &rec, ebpf.UpdateNoExist); err != nil {
		return err
	}
	for role, e := range c.ends {
		ref := shortcutEzAdoptRef{Conn: conn, Role: uint32(role)}
		if err := s.objs.EzScAdoptSocks.Update(e.rec.Cookie, &ref, ebpf.UpdateNoExist); err != nil {
			if role == 1 {
				s.objs.EzScAdoptSocks.Delete(c.ends[0].rec.Cookie)
			}
			s.objs.EzScAdopts.Delete(conn)
			return err
		}
	}
	return nil
}

// purge deletes every entry of a hash keyed by u64.
func purge(m *ebpf.Map) error {
	var keys []uint64
	var k uint64
	it := m.Iterate()
	val := make([]byte, m.ValueSize())
	for it.Next(&k, &val) {
		keys = append(keys, k)
	}
	for _, k := range keys {
		m.Delete(k)
	}
	return it.Err()
}
