package shortcut

import (
	"net/netip"
	"testing"
)

func sock(ns, cookie uint64, local, remote string, snd, rcv uint32) scanSock {
	l, r := netip.MustParseAddrPort(local), netip.MustParseAddrPort(remote)
	rec := shortcutEzAdoptSock{Cookie: cookie, NetnsCookie: ns, TcpState: 1, SndNxt: snd, RcvNxt: rcv,
		LocalIp: l.Addr().As16(), RemoteIp: r.Addr().As16(), LocalPort: l.Port(), RemotePort: r.Port()}
	return newScanSock(rec)
}

func listener(ns uint64, local string) scanSock {
	l := netip.MustParseAddrPort(local)
	return newScanSock(shortcutEzAdoptSock{NetnsCookie: ns, TcpState: 10, LocalIp: l.Addr().As16(), LocalPort: l.Port()})
}

func TestMatchAdoption(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name   string
		socks  []scanSock
		flows  []ctFlow
		pairs  [][2]uint64 // client, server cookies
		skips  adoptSkips
		busyOn uint64 // cookie to mark busy
	}{
		{name: "plain tuple, roles from the listener",
			socks: []scanSock{listener(2, "0.0.0.0:80"), sock(1, 11, "10.0.0.1:5000", "10.0.0.2:80", 100, 900), sock(2, 12, "10.0.0.2:80", "10.0.0.1:5000", 900, 100)},
			pairs: [][2]uint64{{11, 12}}},
		{name: "sequence numbers disagree: in flight",
			socks: []scanSock{listener(2, "0.0.0.0:80"), sock(1, 11, "10.0.0.1:5000", "10.0.0.2:80", 100, 900), sock(2, 12, "10.0.0.2:80", "10.0.0.1:5000", 900, 90)},
			skips: adoptSkips{busy: 1}},
		{name: "busy end", busyOn: 12,
			socks: []scanSock{listener(2, "0.0.0.0:80"), sock(1, 11, "10.0.0.1:5000", "10.0.0.2:80", 100, 900), sock(2, 12, "10.0.0.2:80", "10.0.0.1:5000", 900, 100)},
			skips: adoptSkips{busy: 1}},
		{name: "DNAT through conntrack",
			socks: []scanSock{listener(2, "[::]:7300"), sock(1, 11, "10.0.0.1:5000", "10.96.0.1:80", 100, 900), sock(2, 12, "10.0.0.2:7300", "10.0.0.1:5000", 900, 100)},
			flows: []ctFlow{{netns: 3, origSrc: ap("10.0.0.1:5000"), origDst: ap("10.96.0.1:80"), replySrc: ap("10.0.0.2:7300"), replyDst: ap("10.0.0.1:5000")}},
			pairs: [][2]uint64{{11, 12}}},
		{name: "NAT not known: a sequence match only",
			socks: []scanSock{listener(2, "[::]:7300"), sock(1, 11, "10.0.0.1:5000", "10.96.0.1:80", 100, 900), sock(2, 12, "10.0.0.2:7300", "10.0.0.1:5000", 900, 100)},
			skips: adoptSkips{natUnknown: 1}},
		{name: "peer off the node",
			socks: []scanSock{sock(1, 11, "10.0.0.1:5000", "192.0.2.1:80", 100, 900)},
			skips: adoptSkips{noPeer: 1}},
		{name: "loopback pairs only within a namespace",
			socks: []scanSock{listener(1, "127.0.0.1:80"), listener(2, "127.0.0.1:80"),
				sock(1, 11, "127.0.0.1:5000", "127.0.0.1:80", 100, 900), sock(2, 12, "127.0.0.1:80", "127.0.0.1:5000", 700, 300)},
			skips: adoptSkips{noPeer: 2}},
		{name: "loopback within a namespace",
			socks: []scanSock{listener(1, "127.0.0.1:80"), listener(2, "127.0.0.1:80"),
				sock(1, 11, "127.0.0.1:5000", "127.0.0.1:80", 100, 900), sock(1, 12, "127.0.0.1:80", "127.0.0.1:5000", 900, 100),
				sock(2, 21, "127.0.0.1:5000", "127.0.0.1:80", 300, 700)},
			pairs: [][2]uint64{{11, 12}}, skips: adoptSkips{noPeer: 1}},
		{name: "two candidates for one tuple",
			socks: []scanSock{listener(2, "0.0.0.0:80"), sock(1, 11, "10.0.0.1:5000", "10.0.0.2:80", 100, 900), sock(2, 12, "10.0.0.2:80", "10.0.0.1:5000", 900, 100), sock(3, 13, "10.0.0.2:80", "10.0.0.1:5000", 900, 100)},
			skips: adoptSkips{ambiguous: 1, noPeer: 2}},
		{name: "no listener: roles unknown",
			socks: []scanSock{sock(1, 11, "10.0.0.1:5000", "10.0.0.2:80", 100, 900), sock(2, 12, "10.0.0.2:80", "10.0.0.1:5000", 900, 100)},
			skips: adoptSkips{ambiguous: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.socks {
				if tc.socks[i].rec.Cookie == tc.busyOn && tc.busyOn != 0 {
					tc.socks[i].rec.Busy = uint32(shortcutEzAdoptBusyEZ_AB_UNACKED)
				}
			}
			cands, sk := matchAdoption(tc.socks, tc.flows)
			var got [][2]uint64
			for _, c := range cands {
				got = append(got, [2]uint64{c.ends[0].rec.Cookie, c.ends[1].rec.Cookie})
			}
			if len(got) != len(tc.pairs) || (len(got) > 0 && got[0] != tc.pairs[0]) {
				t.Errorf("pairs %v, want %v", got, tc.pairs)
			}
			if sk != tc.skips {
				t.Errorf("skips %+v, want %+v", sk, tc.skips)
			}
		})
	}
}
