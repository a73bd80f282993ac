package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// TestTraceCrossNode: `eztunnel trace --host-netns N1,N2 --wire-netns UL`
// (from the host) follows a cross-node UDP echo through both lab nodes as
// one lifetime per datagram: the sending pod, the first node (h_), the
// second (h2_, after the untraced underlay), where the packet is routed to
// the bridge device and transmitted again to the pod's port, the receiving
// pod and its socket (sock).
func TestTraceCrossNode(t *testing.T) {
	l := newMultinode(t, multinode.Options{Name: "mntx", Nodes: 2, Mode: multinode.HostGW})
	a, b := mnPod(t, l.Node(1), "a"), mnPod(t, l.Node(2), "b")
	pc := listenUDPIn(t, b, false)
	defer pc.Close()
	port := strings.TrimPrefix(pc.LocalAddr().String(), b.IPv4.String()+":")
	ready := filepath.Join(t.TempDir(), "trace-ready")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr := sysexec.Command(ctx, bin, "trace", "-o", "json", "--proto", "udp", "--port", port, "--ready-file", ready,
		"--host-netns", l.Node(1).NetNS+","+l.Node(2).NetNS, "--wire-netns", l.Underlay)
	var out bytes.Buffer
	errb := &logbuf.Buffer{}
	tr.Stdout, tr.Stderr = &out, errb
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	defer tr.Wait()
	waitFile(t, ready, errb.String)
	udpEchoOn(t, a, pc, 200)
	tr.Process.Signal(syscall.SIGINT)
	if err := tr.Wait(); err != nil {
		t.Fatalf("trace: %v: %s", err, errb.String())
	}
	var sum struct {
		Packets  int               `json:"packets"`
		Counters map[string]uint64 `json:"counters"`
		Paths    []struct {
			Stages  []string `json:"stages"`
			Packets int      `json:"packets"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(out.Bytes(), &sum); err != nil {
		t.Fatalf("trace summary %q: %v", out.String(), err)
	}
	whole := 0
	for _, p := range sum.Paths {
		s := p.Stages
		if len(s) > 0 && s[0] == "p_queue" && slices.Contains(s, "h_xmit") && slices.Contains(s, "h2_rx") &&
			slices.Contains(s, "h2_xmit") && slices.Contains(s, "p_rx") && slices.Contains(s, "sock") {
			whole += p.Packets
		}
	}
	lost := int(sum.Counters["ring_drops"] + sum.Counters["table_full"])
	t.Logf("%d lifetimes, %d from pod to socket across both nodes; paths %+v", sum.Packets, whole, sum.Paths)
	// 400 datagrams (200 each way). Those above the MTU leave as IP
	// fragments: conntrack's defragmentation in each namespace's
	// PRE_ROUTING reassembles them (inet_frag_reasm_prepare frees the
	// fragments) and the datagram goes on in another sk_buff, fragmented
	// again on transmit, so each is several lifetimes. Every other datagram
	// must be one lifetime from the sending pod to the socket, or counted
	// lost.
	fit := 2 * udpFits(a, 200, l.PodMTU)
	if whole > fit || whole+lost < fit {
		t.Errorf("%d of the %d datagrams that fit in the MTU traced from the sending pod through both nodes to the socket (%d counted lost)", whole, fit, lost)
	}
}
