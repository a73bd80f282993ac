package e2e

import (
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/eztunnel/eztunnel/lab/netlab"
)

// TestIdenticalTuplesInTwoNetns: two pods each run 127.0.0.1:7000 and a
// client bound to the same 127.0.0.1 port, at the same time: two live
// connections with one 4-tuple. Keys carry the netns cookie, so each pairs
// with its own server; distinct seeds prove no byte crosses. Istio's
// inbound passthrough (127.0.0.6 -> pod IP) is checked the same way.
func TestIdenticalTuplesInTwoNetns(t *testing.T) {
	e := newEnv(t, "coll", 22)
	pods := []*netlab.Pod{e.pod("a", true), e.pod("b", true)}
	for _, p := range pods {
		e.serve(p, "--stream", "127.0.0.1:7000", "--stream", ":7001")
	}
	e.accelerate()
	big := streamCase{conns: 1, parallel: 1, up: 16 << 20, down: 16 << 20, chunk: 4096}
	for round := 0; round < 5; round++ {
		for _, tc := range []struct {
			name string
			bind string
			addr func(p *netlab.Pod) string
		}{
			{"loopback", "127.0.0.1", func(*netlab.Pod) string { return "127.0.0.1:7000" }},
			{"passthrough-127.0.0.6", "127.0.0.6", func(p *netlab.Pod) string { return hostport(p.IPv4, 7001) }},
		} {
			t.Run(fmt.Sprintf("%s/round%d", tc.name, round), func(t *testing.T) {
				before := e.counters()
				bind := tc.bind + ":" + strconv.Itoa(22000+round) // below the ephemeral range (32768-60999)
				var wg sync.WaitGroup
				errs := make([]error, len(pods))
				outs := make([]string, len(pods))
				for i, p := range pods {
					wg.Add(1)
					go func() {
						defer wg.Done()
						args := append(big.args(tc.addr(p), 1000*(i+1)+round), "--bind", bind)
						outs[i], errs[i] = e.run(p, args...)
					}()
				}
				wg.Wait()
				for i := range pods {
					if errs[i] != nil {
						t.Fatalf("pod %s: %v\n%s", pods[i].Name, errs[i], outs[i])
					}
				}
				d := delta(before, e.counters())
				requirePaired(t, d, 2, 1, "two connections")
				if d["fallback_ambiguous"] != 0 {
					t.Errorf("want no ambiguous fallback: %v", d)
				}
			})
		}
	}
}
