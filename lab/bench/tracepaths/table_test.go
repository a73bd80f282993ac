package tracepaths

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/tracer"
)

var (
	cli = netip.MustParseAddr("10.88.1.2")
	srv = netip.MustParseAddr("10.88.2.2")
)

// stage finds a stage by name.
func stage(t *testing.T, name string) tracer.Stage {
	t.Helper()
	for s := tracer.Stage(0); s < tracer.StageCount; s++ {
		if s.String() == name {
			return s
		}
	}
	t.Fatalf("no stage %q", name)
	return 0
}

// crossNode is a request lifetime from cli to srv:7000 that starts at
// start ns; the server's node takes node2 ns, the socket queue 1000 ns
// after the receiving pod's rx, the read 700 ns later and the free 500 ns
// after the read.
func crossNode(t *testing.T, start, node2 uint64) tracer.Record {
	r := tracer.Record{Src: cli, Dst: srv, SPort: 40000, DPort: 7000}
	ts := start
	for _, st := range []struct {
		name string
		d    uint64
	}{{"p_queue", 0}, {"p_xmit", 100}, {"h_rx", 100}, {"h_xmit", 1000}, {"h2_rx", 300}, {"h2_xmit", node2}, {"p_rx", 100}, {"sock", 1000}, {"copy", 700}, {"free", 500}} {
		ts += st.d
		r.TS[stage(t, st.name)] = ts
	}
	r.LastNS = ts
	return r
}

func TestLifetimeOf(t *testing.T) {
	r := crossNode(t, 1_000_000, 2000)
	lt := lifetimeOf(&r)
	if !lt.complete {
		t.Fatal("a lifetime from the sending pod to the socket is complete")
	}
	// sending pod 100, node 1 1100, wire 300, node 2 2000, receiving pod 1100
	want := [nsCount]uint64{100, 1100, 300, 2000, 1100}
	if lt.parts != want {
		t.Errorf("parts %v, want %v", lt.parts, want)
	}
	var sum uint64
	for _, v := range lt.parts {
		sum += v
	}
	if lt.e2e != 4600 || sum != lt.e2e {
		t.Errorf("e2e %d (want 4600, to the socket), parts add up to %d", lt.e2e, sum)
	}
	if d, ok := lt.direction(srv, 7000); !ok || d != Request {
		t.Errorf("direction %q %v", d, ok)
	}
	back := tracer.Record{Src: srv, Dst: cli, SPort: 7000, DPort: 40000}
	if d, ok := lifetimeOf(&back).direction(srv, 7000); !ok || d != Response {
		t.Errorf("back: direction %q %v", d, ok)
	}
	other := tracer.Record{Src: cli, Dst: srv, SPort: 40000, DPort: 7001}
	if _, ok := lifetimeOf(&other).direction(srv, 7000); ok {
		t.Error("another port counted")
	}

	// Not complete: not queued to a socket (a pure ACK), or not seen in the
	// sending pod.
	r.TS[tracer.StageSock] = 0
	if lifetimeOf(&r).complete {
		t.Error("a lifetime without a read is complete")
	}
	r = crossNode(t, 1_000_000, 2000)
	r.TS[stage(t, "p_queue")], r.TS[stage(t, "p_xmit")] = 0, 0
	if lifetimeOf(&r).complete {
		t.Error("a lifetime that starts in the node is complete")
	}
}

func TestResultsWrite(t *testing.T) {
	res := NewResults()
	res.Rounds = 2
	for round := range 2 {
		for _, dp := range []string{bridgeName, "bypass"} {
			k := Key{Path: CrossNode, Proto: "udp", Datapath: dp}
			node2 := uint64(2000) // bridge: node 2 takes 1000..2980 ns
			for i := range 99 {
				if dp == bridgeName {
					node2 = 1000 + uint64(i)*20
				}
				r := crossNode(t, uint64(1e6*(i+1)), node2)
				res.Add(k, round, srv, 7000, lifetimeOf(&r))
			}
			ack := tracer.Record{Src: cli, Dst: srv, SPort: 40000, DPort: 7000} // never read
			ack.TS[stage(t, "p_queue")] = 5
			res.Add(k, round, srv, 7000, lifetimeOf(&ack))
			res.AddRun(k, run{rttP50: 30 + float64(round), bypassed: 10, sockSend: 200})
		}
	}
	c := res.cells[Key{CrossNode, "udp", Request, bridgeName}]
	if len(c.e2e) != 198 || c.lifetimes != 200 {
		t.Fatalf("bridge cell: %d complete of %d", len(c.e2e), c.lifetimes)
	}
	var b strings.Builder
	res.Write(&b, []string{bridgeName, "bypass"}, []string{"udp"})
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"cross-node, request (client pod → node 1 → wire → node 2 → server pod)",
		// node 2 on the bridge: 1.00..2.96 µs; median 1.98, PDV = P99 - P1.
		"| bridge, UDP ", "1.98 / 1.92", "| bypass, UDP ", "2.00 / 0.00",
		"4.58 / 1.92", // end to end on the bridge: 3.60 + node 2
		"198/200", "30.5",
		"cross-node request UDP, bypass: 100% of 198: p_queue p_xmit h_rx h_xmit h2_rx h2_xmit p_rx sock",
		"cross-node UDP, bypass: bypassed 10",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out, "same-node") || strings.Contains(out, "response (") {
		t.Error("a table without data was printed")
	}
	// bypass vs bridge per round: 4.60 / 4.58 - 1 = +0.4%, printed as +0%.
	if !strings.Contains(out, "+0%") {
		t.Error("no change against the bridge")
	}
}

// TestResultsSocketToSocket: with the shortcut, the few lifetimes of a run
// (handshake, close) are not shown as its request/response.
func TestResultsSocketToSocket(t *testing.T) {
	res := NewResults()
	k := Key{Path: SameNode, Proto: "tcp", Datapath: "bypass+shortcut"}
	r := crossNode(t, 1e6, 2000)
	res.Add(k, 0, srv, 7000, lifetimeOf(&r))
	res.AddRun(k, run{rttP50: 9, sockSend: 10401})
	var b strings.Builder
	res.Write(&b, []string{"bypass+shortcut"}, []string{"tcp"})
	if out := b.String(); !strings.Contains(out, "socket to socket") || strings.Contains(out, "4.60") {
		t.Errorf("a shortcut run shows its handshake as the exchange:\n%s", out)
	}
}

func TestNSColumns(t *testing.T) {
	names, parts := nsColumns(CrossNode, Response)
	if strings.Join(names, ",") != "server pod,node 2,wire,node 1,client pod" || len(parts) != 5 {
		t.Errorf("cross-node response: %v %v", names, parts)
	}
	names, parts = nsColumns(SameNode, Request)
	if strings.Join(names, ",") != "client pod,node,server pod" || parts[1] != nsHost || parts[2] != nsPodIn {
		t.Errorf("same-node request: %v %v", names, parts)
	}
}
