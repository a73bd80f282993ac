// Package rtnl opens netlink handles for exactly the netlink families a
// caller uses.
//
// Quirk: netlink.NewHandle() and NewHandleAt(ns) with no family open one
// socket per family the library supports: NETLINK_ROUTE, NETLINK_XFRM and
// NETLINK_NETFILTER. On a kernel where xfrm_user or nfnetlink is missing
// and cannot be loaded (a reduced module set, kernel.modules_disabled),
// socket(AF_NETLINK, ..., NETLINK_XFRM) fails with EPROTONOSUPPORT and the
// whole handle fails, also for a caller that only lists links and routes.
package rtnl

import (
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Route opens a NETLINK_ROUTE handle in the caller's network namespace:
// links, addresses, routes, neighbours, qdiscs and filters.
func Route() (*netlink.Handle, error) { return netlink.NewHandle(unix.NETLINK_ROUTE) }

// RouteAt opens a NETLINK_ROUTE handle in the network namespace ns.
func RouteAt(ns netns.NsHandle) (*netlink.Handle, error) {
	return netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
}

// ConntrackAt opens a NETLINK_NETFILTER handle in ns, for conntrack tables.
func ConntrackAt(ns netns.NsHandle) (*netlink.Handle, error) {
	return netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
}
