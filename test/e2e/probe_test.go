package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
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
	check := func(p *netlab.Pod) []result {
		t.Helper()
		deadline := time.Now().Add(scaled(10 * time.Second))
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			cmd := p.Cmd(ctx, bin, "probe", "check", "--addr", hostport(b.IPv4, 7070), "--conns", "3", "--bytes", "1048576")
			var out bytes.Buffer
			cmd.Stdout = &out
			err := p.Run(cmd)
			cancel()
			var res []result
			if err == nil {
				if err := json.Unmarshal(out.Bytes(), &res); err != nil || len(res) != 3 {
					t.Fatalf("%s: %v\n%s", p.Name, err, out.String())
				}
				// The server may not listen yet.
				refused := slices.ContainsFunc(res, func(r result) bool { return strings.Contains(r.Error, "connection refused") })
				if !refused || time.Now().After(deadline) {
					return res
				}
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: probe check: %v\n%s", p.Name, err, out.String())
			}
			time.Sleep(100 * time.Millisecond) // the server is starting
		}
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
