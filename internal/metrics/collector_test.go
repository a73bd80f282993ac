package metrics

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

type fakeSource struct {
	counters datapath.Counters
	fill     map[string]datapath.MapFill
	err      error
}

func (f fakeSource) ReadCounters() (datapath.Counters, error) { return f.counters, f.err }
func (f fakeSource) ReadFill() (map[string]datapath.MapFill, error) {
	return f.fill, f.err
}

func source() fakeSource {
	c := datapath.Counters{}
	for i, name := range datapath.CounterNames() {
		c[name] = uint64(i)
	}
	c["pairs"] = 7
	c["fallback_no_local_peer"] = 3
	return fakeSource{counters: c, fill: map[string]datapath.MapFill{
		"sockets": {Entries: 14, MaxEntries: 131072},
		"pairs":   {Entries: 1, MaxEntries: 16384},
		"aliases": {Entries: 0, MaxEntries: 16384},
	}}
}

func TestCollectorExports(t *testing.T) {
	c := NewCollector(source(), "v9")
	want := `
# HELP eztunnel_pairs_total Connections with both directions redirected.
# TYPE eztunnel_pairs_total counter
eztunnel_pairs_total 7
# HELP eztunnel_map_entries Entries in a datapath map.
# TYPE eztunnel_map_entries gauge
eztunnel_map_entries{map="aliases"} 0
eztunnel_map_entries{map="pairs"} 1
eztunnel_map_entries{map="sockets"} 14
# HELP eztunnel_map_max_entries Capacity of a datapath map.
# TYPE eztunnel_map_max_entries gauge
eztunnel_map_max_entries{map="aliases"} 16384
eztunnel_map_max_entries{map="pairs"} 16384
eztunnel_map_max_entries{map="sockets"} 131072
# HELP eztunnel_agent_info Version of the agent and schema of the pinned datapath; always 1.
# TYPE eztunnel_agent_info gauge
eztunnel_agent_info{schema="` + datapath.Schema + `",version="v9"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"eztunnel_pairs_total", "eztunnel_map_entries", "eztunnel_map_max_entries", "eztunnel_agent_info"); err != nil {
		t.Error(err)
	}
	// Every datapath counter is exported: the fallbacks as one vector.
	fallbacks, msgs, skips, others := 0, 0, 0, 0
	for _, name := range datapath.CounterNames() {
		if name == "fallback_peer_gone" {
			msgs++
		} else if strings.HasPrefix(name, "fallback_") {
			fallbacks++
		} else if strings.HasPrefix(name, "adopt_skipped_") {
			skips++
		} else {
			others++
		}
	}
	if n := testutil.CollectAndCount(c, "eztunnel_fallbacks_total"); n != fallbacks {
		t.Errorf("%d fallback series, want %d", n, fallbacks)
	}
	// Units do not mix: peer_gone counts messages, the others connections.
	if n := testutil.CollectAndCount(c, "eztunnel_fallback_messages_total"); n != msgs || msgs != 1 {
		t.Errorf("%d fallback message series, want %d (peer_gone)", n, msgs)
	}
	if n := testutil.CollectAndCount(c, "eztunnel_adopt_skipped_total"); n != skips || skips == 0 {
		t.Errorf("%d adoption skip series, want %d", n, skips)
	}
	if n := testutil.CollectAndCount(c); n != others+fallbacks+msgs+skips+2*3+2 {
		t.Errorf("%d series in all", n)
	}
	if problems, err := testutil.CollectAndLint(c); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}
}

// A failed read leaves those series out and sets eztunnel_datapath_up to 0;
// the scrape itself succeeds.
func TestCollectorReportsReadErrors(t *testing.T) {
	c := NewCollector(fakeSource{err: errors.New("map gone")}, "v9")
	want := `
# HELP eztunnel_datapath_up 1 if this scrape read every datapath map, 0 if a read failed (the agent logs why).
# TYPE eztunnel_datapath_up gauge
eztunnel_datapath_up 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "eztunnel_datapath_up"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "eztunnel_pairs_total"); n != 0 {
		t.Errorf("%d pairs series after a failed read", n)
	}
}
