//go:build k8s

package k8s

import (
	"strings"
	"testing"
)

// TestCluster: the cluster itself, before any agent: pods start from the
// locally built images, reach each other directly and through a ClusterIP
// Service (kube-proxy DNAT) with byte-exact streams, and kubectl logs and
// exec reach the kubelet on the node IP.
func TestCluster(tt *testing.T) {
	t := summarized(tt)
	if l := leftovers(); len(l) > 0 {
		t.Fatalf("eztunnel state on the host: %v", l)
	}
	a := newApp(t, "ez-plain", nil)
	a.stream(t, a.serverIP+":7000", 8, streamLen)
	a.stream(t, a.svcIP+":80", 8, streamLen)
	node := kubectl(t, "get", "node", "-o", "jsonpath={.items[0].status.addresses}")
	if !strings.Contains(node, `"InternalIP"`) {
		t.Errorf("node addresses: %s", node)
	}
	if out := kubectl(t, "-n", a.ns, "logs", "server"); strings.Contains(out, "error") {
		t.Errorf("server log: %s", out)
	}
}
