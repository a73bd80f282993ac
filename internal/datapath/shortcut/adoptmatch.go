package shortcut

import (
	"net/netip"
)

// Matching the ends of connections established before the agent
// (adopt.go). Pure: unit-tested with synthetic scans.

// scanSock is one socket from ez_sc_adopt_scan.
type scanSock struct {
	rec    shortcutEzAdoptSock
	local  netip.AddrPort
	remote netip.AddrPort
}

func newScanSock(rec shortcutEzAdoptSock) scanSock {
	return scanSock{
		rec:    rec,
		local:  netip.AddrPortFrom(netip.AddrFrom16(rec.LocalIp).Unmap(), rec.LocalPort),
		remote: netip.AddrPortFrom(netip.AddrFrom16(rec.RemoteIp).Unmap(), rec.RemotePort),
	}
}

func (s *scanSock) listener() bool    { return s.rec.TcpState == 10 }
func (s *scanSock) established() bool { return s.rec.TcpState == 1 }

// loopback tuples repeat in every namespace; others are unique on a node.
func (s *scanSock) nsKey() uint64 {
	if s.local.Addr().IsLoopback() || s.remote.Addr().IsLoopback() {
		return s.rec.NetnsCookie
	}
	return 0
}

// ctFlow is one NAT-ed conntrack entry: the original tuple (as the client
// sent it) and the reply tuple (as the server answers).
type ctFlow struct {
	netns              uint64 // netns cookie of the table it came from
	origSrc, origDst   netip.AddrPort
	replySrc, replyDst netip.AddrPort
}

type tupleKey struct {
	ns            uint64
	local, remote netip.AddrPort
}

// adoptCandidate is a matched connection: ends[0] the client, ends[1] the server.
type adoptCandidate struct {
	ends [2]scanSock
	key  shortcutEzConnKey
}

// skip reasons the agent decides (enum ez_adopt_counter).
type adoptSkips struct {
	busy, noPeer, natUnknown, ambiguous, unsupported uint64
}

// adoptable: its storage says it is on the kernel path (or it has none).
// Sockets on the shortcut, waiting, left after a switch or mid-adoption
// are none of adoption's business.
func adoptable(s *scanSock) bool {
	st := shortcutEzSockState(s.rec.State)
	return st == shortcutEzSockStateEZ_SOCK_SEEN || st == shortcutEzSockStateEZ_SOCK_KERNEL
}

// matchAdoption pairs the scanned sockets of all namespaces. A pair is
// linked by its 4-tuple (no NAT), or through one or two conntrack
// translations; both ends must be quiet and their sequence numbers must
// agree (what one sent next is what the other expects next).
func matchAdoption(socks []scanSock, flows []ctFlow) ([]adoptCandidate, adoptSkips) {
	var sk adoptSkips
	byTuple := map[tupleKey][]int{}
	type lkey struct {
		netns uint64
		port  uint16
	}
	listeners := map[lkey][]netip.Addr{}
	for i := range socks {
		s := &socks[i]
		if s.listener() {
			k := lkey{s.rec.NetnsCookie, s.local.Port()}
			listeners[k] = append(listeners[k], s.local.Addr())
			continue
		}
		k := tupleKey{s.nsKey(), s.local, s.remote}
		byTuple[k] = append(byTuple[k], i)
	}
	isServer := func(s *scanSock) bool {
		for _, a := range listeners[lkey{s.rec.NetnsCookie, s.local.Port()}] {
			if a.IsUnspecified() || a == s.local.Addr() {
				return true
			}
		}
		return false
	}
	natByOrig := map[tupleKey][]*ctFlow{}
	for i := range flows {
		f := &flows[i]
		ns := uint64(0)
		if f.origSrc.Addr().IsLoopback() || f.origDst.Addr().IsLoopback() {
			ns = f.netns
		}
		k := tupleKey{ns, f.origSrc, f.origDst}
		natByOrig[k] = append(natByOrig[k], f)
	}
	// peerOf finds the socket that sees the other side of the tuple
	// (local, remote) seen from ns, following NAT entries.
	var peerOf func(ns uint64, local, remote netip.AddrPort, depth int) (idx int, found, ambiguous bool)
	peerOf = func(ns uint64, local, remote netip.AddrPort, depth int) (int, bool, bool) {
		nk := uint64(0)
		if local.Addr().IsLoopback() || remote.Addr().IsLoopback() {
			nk = ns
		}
		if c := byTuple[tupleKey{nk, remote, local}]; len(c) == 1 {
			return c[0], true, false
		} else if len(c) > 1 {
			return 0, true, true
		}
		if depth == 2 {
			return 0, false, false
		}
		fs := natByOrig[tupleKey{nk, local, remote}]
		if len(fs) > 1 {
			return 0, true, true
		}
		if len(fs) == 1 {
			// After NAT the client is replyDst and the server replySrc.
			return peerOf(ns, fs[0].replyDst, fs[0].replySrc, depth+1)
		}
		return 0, false, false
	}

	done := make([]bool, len(socks))
	var out []adoptCandidate
	var unmatched []int
	for i := range socks {
		s := &socks[i]
		if !s.established() || done[i] || !adoptable(s) {
			continue
		}
		j, found, amb := peerOf(s.rec.NetnsCookie, s.local, s.remote, 0)
		if !found || (!amb && done[j]) {
			unmatched = append(unmatched, i)
			continue
		}
		if amb || j == i {
			done[i] = true
			sk.ambiguous++
			continue
		}
		p := &socks[j]
		done[i], done[j] = true, true
		if !adoptable(p) {
			continue
		}
		busy := s.rec.Busy | p.rec.Busy
		if busy&uint32(shortcutEzAdoptBusyEZ_AB_UNSUPPORTED|shortcutEzAdoptBusyEZ_AB_CLOSING) != 0 {
			sk.unsupported++
			continue
		}
		if busy != 0 || s.rec.SndNxt != p.rec.RcvNxt || p.rec.SndNxt != s.rec.RcvNxt {
			sk.busy++ // bytes in flight: the numbers agree once it is quiet
			continue
		}
		si, pi := isServer(s), isServer(p)
		if si == pi {
			sk.ambiguous++ // no listener (closed since), or both ports listen
			continue
		}
		c := adoptCandidate{ends: [2]scanSock{*s, *p}}
		if si {
			c.ends = [2]scanSock{*p, *s}
		}
		c.key = adoptKey(&c.ends[1])
		out = append(out, c)
	}
	skipUnmatched(socks, unmatched, done, &sk)
	return out, sk
}

// skipUnmatched counts the sockets no peer was found for: a quiet socket
// whose sequence numbers match another unmatched one has a local peer that
// nothing we know links it to (NAT unknown); the others have none.
func skipUnmatched(socks []scanSock, unmatched []int, done []bool, sk *adoptSkips) {
	seq := map[[2]uint32]int{}
	for _, i := range unmatched {
		s := &socks[i]
		if s.rec.Busy == 0 {
			seq[[2]uint32{s.rec.SndNxt, s.rec.RcvNxt}] = i
		}
	}
	for _, i := range unmatched {
		if done[i] {
			continue
		}
		s := &socks[i]
		if j, ok := seq[[2]uint32{s.rec.RcvNxt, s.rec.SndNxt}]; ok && j != i && s.rec.Busy == 0 && !done[j] {
			done[i], done[j] = true, true
			sk.natUnknown++
			continue
		}
		done[i] = true
		sk.noPeer++
	}
}

// adoptKey names a connection as its server's socket sees it: the client
// and server after every NAT on the way (what pairing at handshake learns).
func adoptKey(server *scanSock) shortcutEzConnKey {
	k := shortcutEzConnKey{
		ClientIp:   server.remote.Addr().As16(),
		ServerIp:   server.local.Addr().As16(),
		ClientPort: server.remote.Port(),
		ServerPort: server.local.Port(),
	}
	if server.nsKey() != 0 {
		k.Netns = server.rec.NetnsCookie
	}
	return k
}
