package meshlab

import (
	"net/netip"
	"strconv"
)

// sidecarCapture is the nat table istio-iptables writes into a pod in
// REDIRECT mode, trimmed to what TCP needs: inbound TCP goes to 15006,
// outbound TCP of everyone but the proxy uid goes to 15001, loopback
// traffic of the app stays local. The rules live in the pod's netns and go
// away with it.
func sidecarCapture() [][]string {
	uid := strconv.Itoa(proxyUID)
	return [][]string{
		{"-N", "ISTIO_INBOUND"},
		{"-N", "ISTIO_IN_REDIRECT"},
		{"-N", "ISTIO_OUTPUT"},
		{"-N", "ISTIO_REDIRECT"},
		{"-A", "PREROUTING", "-p", "tcp", "-j", "ISTIO_INBOUND"},
		{"-A", "ISTIO_INBOUND", "-p", "tcp", "--dport", "15090", "-j", "RETURN"},
		{"-A", "ISTIO_INBOUND", "-p", "tcp", "-j", "ISTIO_IN_REDIRECT"},
		{"-A", "ISTIO_IN_REDIRECT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", strconv.Itoa(portInbound)},
		{"-A", "OUTPUT", "-p", "tcp", "-j", "ISTIO_OUTPUT"},
		{"-A", "ISTIO_OUTPUT", "-s", "127.0.0.6/32", "-o", "lo", "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "!", "-d", "127.0.0.1/32", "-o", "lo", "-m", "owner", "--uid-owner", uid, "-j", "ISTIO_IN_REDIRECT"},
		{"-A", "ISTIO_OUTPUT", "-o", "lo", "-m", "owner", "!", "--uid-owner", uid, "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "-m", "owner", "--uid-owner", uid, "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "-d", "127.0.0.1/32", "-j", "RETURN"},
		{"-A", "ISTIO_OUTPUT", "-j", "ISTIO_REDIRECT"},
		{"-A", "ISTIO_REDIRECT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", strconv.Itoa(portOutbound)},
	}
}

// ambientCapture sends every TCP connection the client pod opens to the
// server pod to the node proxy instead, keeping the port: the node proxy
// listens on each service port. (ztunnel's in-pod redirection instead
// listens inside the pod's netns and reads the original destination.)
func ambientCapture(server, nodeProxy netip.Addr) [][]string {
	return [][]string{
		{"-A", "OUTPUT", "-p", "tcp", "-d", server.String() + "/32", "-j", "DNAT", "--to-destination", nodeProxy.String()},
	}
}
