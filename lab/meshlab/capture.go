package meshlab

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/eztunnel/eztunnel/lab/netlab"
)

// SidecarCapture is the nat table istio-iptables writes into a pod in
// REDIRECT mode, trimmed to what TCP needs, as iptables-restore input:
// inbound TCP goes to 15006, outbound TCP of everyone but the proxy uid
// goes to 15001, loopback traffic of the app stays local. Istio returns its
// own ports (15008, 15090, 15021, 15020) in ISTIO_INBOUND; 15090 stands for
// them. The rules live in the pod's netns and go away with it.
//
// Connections to PortEchoKernel go to the sidecars' second listeners
// (PortOutboundKernel, PortInboundKernel) instead: the same proxies, on
// ports the paired ping-echo's datapath excludes.
func SidecarCapture() string {
	uid := strconv.Itoa(ProxyUID)
	kernel := strconv.Itoa(PortEchoKernel)
	return natBatch(
		[]string{"ISTIO_INBOUND", "ISTIO_IN_REDIRECT", "ISTIO_OUTPUT", "ISTIO_REDIRECT"},
		"-A PREROUTING -p tcp -j ISTIO_INBOUND",
		"-A ISTIO_INBOUND -p tcp --dport 15090 -j RETURN",
		"-A ISTIO_INBOUND -p tcp -j ISTIO_IN_REDIRECT",
		"-A ISTIO_IN_REDIRECT -p tcp --dport "+kernel+" -j REDIRECT --to-ports "+strconv.Itoa(PortInboundKernel),
		"-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports "+strconv.Itoa(PortInbound),
		"-A OUTPUT -p tcp -j ISTIO_OUTPUT",
		"-A ISTIO_OUTPUT -s 127.0.0.6/32 -o lo -j RETURN",
		"-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -m owner --uid-owner "+uid+" -j ISTIO_IN_REDIRECT",
		"-A ISTIO_OUTPUT -o lo -m owner ! --uid-owner "+uid+" -j RETURN",
		"-A ISTIO_OUTPUT -m owner --uid-owner "+uid+" -j RETURN",
		"-A ISTIO_OUTPUT -d 127.0.0.1/32 -j RETURN",
		"-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
		"-A ISTIO_REDIRECT -p tcp --dport "+kernel+" -j REDIRECT --to-ports "+strconv.Itoa(PortOutboundKernel),
		"-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports "+strconv.Itoa(PortOutbound),
	)
}

// AmbientCapture sends every TCP connection the client pod opens to the
// server pod to the node proxy instead, keeping the port: the node proxy
// listens on each service port. (ztunnel's in-pod redirection instead
// listens inside the pod's netns and reads the original destination.)
func AmbientCapture(server, nodeProxy netip.Addr) string {
	return natBatch(nil, "-A OUTPUT -p tcp -d "+server.String()+"/32 -j DNAT --to-destination "+nodeProxy.String())
}

// natBatch is iptables-restore input for the nat table: new chains, rules.
func natBatch(chains []string, rules ...string) string {
	var b strings.Builder
	b.WriteString("*nat\n")
	for _, c := range chains {
		fmt.Fprintf(&b, ":%s - [0:0]\n", c)
	}
	for _, r := range rules {
		b.WriteString(r + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// InstallCapture applies an iptables-restore batch in p's netns in one
// process, without flushing what is there, as istio-iptables does.
func InstallCapture(ctx context.Context, p *netlab.Pod, batch string) error {
	cmd := netlab.NetnsCmd(ctx, p.NetNS, "iptables-restore", "-w", "--noflush")
	cmd.Stdin = strings.NewReader(batch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore in %s: %w: %s\n%s", p.Name, err, out, batch)
	}
	return nil
}
