// Package meshlab builds a benchmark node with a service mesh emulated by
// real proxies: a client pod and a server pod on a netlab bridge, and,
// depending on the mesh mode, an HAProxy sidecar in each pod with Istio's
// iptables capture (sidecar) or one shared node proxy in a namespace of its
// own that all pod traffic is redirected through (ambient), optionally with
// TLS between the proxies. It starts the servers the benchmark workloads
// talk to: an echo/stream server, redis-server and nginx.
package meshlab

import (
	"fmt"
	"strings"
)

// Mesh is a service-mesh mode of the node.
type Mesh struct {
	Kind string // "none", "sidecar" or "ambient"
	TLS  bool   // TLS between the proxies (HAProxy ssl), as mTLS
}

// Meshes lists every mode ParseMesh accepts.
var Meshes = []string{"none", "sidecar", "ambient", "sidecar-tls", "ambient-tls"}

// ParseMesh reads "none", "sidecar", "ambient", "sidecar-tls" or "ambient-tls".
func ParseMesh(s string) (Mesh, error) {
	kind, tls := strings.CutSuffix(s, "-tls")
	switch {
	case kind == "none" && !tls, kind == "sidecar", kind == "ambient":
		return Mesh{Kind: kind, TLS: tls}, nil
	}
	return Mesh{}, fmt.Errorf("unknown mesh mode %q (one of %s)", s, strings.Join(Meshes, ", "))
}

func (m Mesh) String() string {
	if m.TLS {
		return m.Kind + "-tls"
	}
	return m.Kind
}

// Ports of the servers in the server pod.
const (
	PortStream = 7000
	PortEcho   = 7001
	PortRedis  = 6379
	PortHTTP   = 8080
	PortPool   = 7300 // echo of pool clients (Go netpoller): connections opened before the agent
	// PortEchoKernel is the echo server's second port: the same process and,
	// in every mesh mode, the same proxies and hops as PortEcho, each hop
	// on a port of its own (KernelPathPorts). The paired ping-echo of
	// `bench lab` excludes those ports from the shortcut: a connection to
	// it is the kernel path, one to PortEcho the shortcut.
	PortEchoKernel = 7002
)

// servicePorts are every port the workloads connect to.
var servicePorts = []int{PortStream, PortEcho, PortRedis, PortHTTP, PortPool, PortEchoKernel}

// Istio's sidecar ports and proxy uid (istio-proxy is uid 1337).
const (
	ProxyUID     = 1337
	PortOutbound = 15001
	PortInbound  = 15006
	// ambientInboundOffset: the node proxy's inbound listener for service
	// port p is 127.0.0.1:p+offset (ztunnel uses one port, 15008, and HBONE
	// CONNECT to name the destination; HAProxy in tcp mode needs one each).
	ambientInboundOffset = 20000
	// The sidecars' listeners for connections to PortEchoKernel: the same
	// frontends as PortOutbound and PortInbound, on ports of their own
	// (the capture sends PortEchoKernel there).
	PortOutboundKernel = 15002
	PortInboundKernel  = 15007
)

// KernelPathPorts are the server ports of every leg of a connection to
// PortEchoKernel, in every mesh mode: the echo server's, the sidecars'
// and the node proxy's inbound listener. A datapath that excludes them
// (Selection.ExcludePorts) leaves such connections on the kernel path,
// every other one as it was.
var KernelPathPorts = []uint16{PortEchoKernel, PortOutboundKernel, PortInboundKernel, PortEchoKernel + ambientInboundOffset}
