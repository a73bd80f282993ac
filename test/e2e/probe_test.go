package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/lab/netlab"
)

// TestProbe: `eztunnel probe check` (what kubectl eztunnel connectivity
// runs in its pods) reads every byte back and tells an accelerated
// connection from a plain one by the client socket's TCP counters, as the
// datapath's own counters do.
func TestProbe(t *testing.T) {
	e := newEnv(t, "probe", 94)
	a, b, u := e.pod("a", true), e.pod("b", true), e.pod("u", false)
	e.accelerate()
	e.startIn(b, bin, "probe", "serve", "--addr", ":7070")
	type result struct {
		Exact, Accelerated bool
		Error              string
		TCPBytesAcked      uint64 `json:"tcp_bytes_acked"`
		TCPBytesReceived   uint64 `json:"tcp_bytes_received"`
	}
	// Wait for the listener rather than retry refused probes: a retry
	// after a partly refused run would count the first run's pairs too.
	waitListen(t, b, 7070)
	check := func(p *netlab.Pod) []result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := p.Cmd(ctx, bin, "probe", "check", "--addr", hostport(b.IPv4, 7070), "--conns", "3", "--bytes", "1048576")
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := p.Run(cmd); err != nil {
			t.Fatalf("%s: probe check: %v\n%s", p.Name, err, out.String())
		}
		var res []result
		if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res) != 3 {
			t.Fatalf("%s: %v\n%s", p.Name, err, out.String())
		}
		return res
	}
	before := e.counters()
	for _, c := range []struct {
		p    *netlab.Pod
		want bool
	}{{a, true}, {u, false}} {
		for _, r := range check(c.p) {
			if !r.Exact || r.Error != "" || r.Accelerated != c.want {
				t.Errorf("from %s: %+v, want exact and accelerated=%v", c.p.Name, r, c.want)
			}
		}
	}
	if d := delta(before, e.counters()); d["pairs"] != 3 {
		t.Errorf("the datapath paired %d connections, want the 3 from the managed pod", d["pairs"])
	} else if t.Failed() {
		t.Logf("counters: %v", d)
	}
}
