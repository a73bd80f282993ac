package bypass

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeBypass struct {
	counters map[string]uint64
	err      error
	standby  string
	kinds    map[string]string
}

func (f fakeBypass) BypassCounters() (map[string]uint64, error) { return f.counters, f.err }
func (f fakeBypass) BypassState() (int, int)                    { return 3, 6 }
func (f fakeBypass) BypassStandbyKind() string                  { return f.standby }
func (f fakeBypass) BypassIdleKinds() map[string]string         { return f.kinds }

func TestBypassCollectorIdleDevices(t *testing.T) {
	col := newCollector(fakeBypass{counters: map[string]uint64{},
		kinds: map[string]string{"vethb": "no_endpoint", "eth1": "uplink_down", "vethc": "qdisc", "vethd": "qdisc"}})
	want := `# HELP eztunnel_bypass_idle_device 1 for each pod veth or uplink the bridge bypass does not attach to because it could not act there or must not, with the reason as in eztunnel_bypass_idle_devices.
# TYPE eztunnel_bypass_idle_device gauge
eztunnel_bypass_idle_device{device="eth1",reason="uplink_down"} 1
eztunnel_bypass_idle_device{device="vethb",reason="no_endpoint"} 1
eztunnel_bypass_idle_device{device="vethc",reason="qdisc"} 1
eztunnel_bypass_idle_device{device="vethd",reason="qdisc"} 1
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "eztunnel_bypass_idle_device"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(col, "eztunnel_bypass_idle_devices"); n != len(IdleKinds) {
		t.Errorf("eztunnel_bypass_idle_devices: %d series, want %d (one per reason, always)", n, len(IdleKinds))
	}
	if err := testutil.CollectAndCompare(col, strings.NewReader(`# HELP eztunnel_bypass_idle_devices `+idleDevicesHelp+`
# TYPE eztunnel_bypass_idle_devices gauge
eztunnel_bypass_idle_devices{reason="bandwidth_annotation"} 0
eztunnel_bypass_idle_devices{reason="no_endpoint"} 1
eztunnel_bypass_idle_devices{reason="other"} 0
eztunnel_bypass_idle_devices{reason="qdisc"} 2
eztunnel_bypass_idle_devices{reason="tc_filter"} 0
eztunnel_bypass_idle_devices{reason="tc_unreadable"} 0
eztunnel_bypass_idle_devices{reason="tcx_program"} 0
eztunnel_bypass_idle_devices{reason="uplink_down"} 1
`), "eztunnel_bypass_idle_devices"); err != nil {
		t.Error(err)
	}
}

func TestBypassCollectorExports(t *testing.T) {
	c := map[string]uint64{}
	fallbacks := 0
	for i, name := range CounterNames() {
		c[name] = uint64(i)
		if strings.HasPrefix(name, "fallback_") {
			fallbacks++
		}
	}
	c["bypassed_packets"], c["bypassed_bytes"], c["fallback_nat"] = 10, 15000, 4
	col := newCollector(fakeBypass{counters: c})
	want := `
# HELP eztunnel_bypass_packets_total Packets the bridge bypass redirected into their destination pod.
# TYPE eztunnel_bypass_packets_total counter
eztunnel_bypass_packets_total 10
# HELP eztunnel_bypass_bytes_total Bytes (frames) the bridge bypass redirected into their destination pod.
# TYPE eztunnel_bypass_bytes_total counter
eztunnel_bypass_bytes_total 15000
# HELP eztunnel_bypass_devices Pod veths and uplinks the bridge bypass is attached to.
# TYPE eztunnel_bypass_devices gauge
eztunnel_bypass_devices 3
# HELP eztunnel_bypass_endpoints Pod addresses the bridge bypass delivers to.
# TYPE eztunnel_bypass_endpoints gauge
eztunnel_bypass_endpoints 6
# HELP eztunnel_bypass_up 1 if this scrape read the bridge bypass's counters, 0 if not (the agent logs why).
# TYPE eztunnel_bypass_up gauge
eztunnel_bypass_up 1
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "eztunnel_bypass_packets_total", "eztunnel_bypass_bytes_total",
		"eztunnel_bypass_devices", "eztunnel_bypass_endpoints", "eztunnel_bypass_up"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(col, "eztunnel_bypass_fallbacks_total"); n != fallbacks || fallbacks == 0 {
		t.Errorf("%d fallback series, want %d", n, fallbacks)
	}
	// Every counter is exported, each once.
	if n := testutil.CollectAndCount(col); n != len(c)+4+len(IdleKinds) {
		t.Errorf("%d series, want %d", n, len(c)+4+len(IdleKinds))
	}
	if problems, err := testutil.CollectAndLint(col); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", err, problems)
	}
}

// TestBypassCollectorStandby: eztunnel_bypass_standby is 1 with the reason
// while the bypass stands by, 0 otherwise.
func TestBypassCollectorStandby(t *testing.T) {
	for _, c := range []struct{ standby, want string }{
		{"", `eztunnel_bypass_standby{reason=""} 0`},
		{standbyKindConntrackInactive, `eztunnel_bypass_standby{reason="conntrack_inactive"} 1`},
		{"conntrack does not run", `eztunnel_bypass_standby{reason="other"} 1`},
	} {
		col := newCollector(fakeBypass{counters: map[string]uint64{}, standby: c.standby})
		want := "# HELP eztunnel_bypass_standby 1 while the loaded bridge bypass is attached nowhere because it could not act here (reason: conntrack_inactive, conntrack does not run in the node's network namespace, so every packet would fall back; conntrack_unreadable); 0 with reason \"\" otherwise.\n# TYPE eztunnel_bypass_standby gauge\n" + c.want + "\n"
		if err := testutil.CollectAndCompare(col, strings.NewReader(want), "eztunnel_bypass_standby"); err != nil {
			t.Errorf("standby %q: %v", c.standby, err)
		}
	}
}

func TestBypassCollectorReadError(t *testing.T) {
	col := newCollector(fakeBypass{err: errors.New("closed")})
	want := `
# HELP eztunnel_bypass_up 1 if this scrape read the bridge bypass's counters, 0 if not (the agent logs why).
# TYPE eztunnel_bypass_up gauge
eztunnel_bypass_up 0
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "eztunnel_bypass_up"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(col, "eztunnel_bypass_packets_total"); n != 0 {
		t.Errorf("%d packet series after a failed read", n)
	}
}

type fakeManaged struct {
	fakeBypass
	n  int
	ok bool
}

func (f fakeManaged) BypassManagedNeighbours() (int, bool) { return f.n, f.ok }

// TestBypassManagedNeighbours: the gauge is exported only by a source that
// keeps managed neighbours (Kubernetes mode) and once it has the pods.
func TestBypassManagedNeighbours(t *testing.T) {
	want := `
# HELP eztunnel_bypass_managed_neighbours Kernel-managed neighbour entries the agent keeps on the pod bridges for the node's pods (Kubernetes mode; absent otherwise).
# TYPE eztunnel_bypass_managed_neighbours gauge
eztunnel_bypass_managed_neighbours 4
`
	if err := testutil.CollectAndCompare(newCollector(fakeManaged{n: 4, ok: true}), strings.NewReader(want), "eztunnel_bypass_managed_neighbours"); err != nil {
		t.Error(err)
	}
	for _, src := range []source{fakeManaged{n: 4}, fakeBypass{}} {
		if n := testutil.CollectAndCount(newCollector(src), "eztunnel_bypass_managed_neighbours"); n != 0 {
			t.Errorf("%T: %d managed-neighbour series, want 0", src, n)
		}
	}
}
