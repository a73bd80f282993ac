package bypass

import (
	"errors"
	"log/slog"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// routingGroups are the rtnetlink groups whose notifications can change
// what a cached cross-node check found (bpf_fib_lookup's answer and the
// routes back the source check takes): links (state, MTU), addresses,
// routes, policy rules, neighbours (a next hop's or a pod's MAC) and
// forwarding settings (netconf).
var routingGroups = []uint{
	unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH,
	unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
	unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
	unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
	unix.RTNLGRP_IPV4_NETCONF, unix.RTNLGRP_IPV6_NETCONF,
}

// watchRouting calls bump for every datagram of rtnetlink notifications
// of routingGroups in ns (netns.None(): the caller's), and when
// notifications were lost (ENOBUFS, the socket's buffer overran), until
// stop. So a cross-node flow's cached checks end once a route, rule,
// neighbour, address or link of the node changed and this read it; the
// recheck time bounds the delay. A neighbour's periodic state changes
// (REACHABLE -> STALE) notify too: each empties the cache, which costs each
// flow one full check.
func watchRouting(ns netns.NsHandle, bump func() error) (stop func(), err error) {
	s, err := nl.SubscribeAt(ns, netns.None(), unix.NETLINK_ROUTE, routingGroups...)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msgs, _, err := s.Receive()
			if err != nil && !errors.Is(err, unix.ENOBUFS) {
				return // closed by stop, or the socket failed
			}
			if err == nil && len(msgs) == 0 {
				continue
			}
			if err := bump(); err != nil {
				slog.Warn("bypass: flow cache generation after a routing change", "err", err)
			}
		}
	}()
	return func() { s.Close(); <-done }, nil
}
