package meshmatrix

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/lab/bench/bypass"
	"github.com/eztunnel/eztunnel/lab/bench/mesh"
)

// wrk 4.2's output for one of the bench's runs.
const wrkOut = `Running 2s test @ http://127.0.0.1:15001/index.html
  1 threads and 10 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     0.90ms  250.00us   5.03ms   90.00%
    Req/Sec    10.98k   500.00    11.50k    70.00%
  Latency Distribution
     50%  870.00us
     75%    0.95ms
     90%    1.08ms
     99%    1.28ms
  21852 requests in 2.00s, 17.30MB read
Requests/sec:  10926.00
Transfer/sec:      8.65MB
`

func TestParseWrkErrors(t *testing.T) {
	w, err := mesh.ParseWrk(wrkOut)
	if err != nil {
		t.Fatal(err)
	}
	if w.Requests != 21852 || w.RPS != 10926 || w.P50Us != 870 || w.P90Us != 1080 || w.P99Us != 1280 || w.AvgUs != 900 {
		t.Errorf("parsed %+v", w)
	}
	if err := check(Baseline, sample{wrk: w}); err != nil {
		t.Errorf("clean run: %v", err)
	}
	for _, tail := range []string{
		"  Socket errors: connect 0, read 1, write 0, timeout 0\n",
		"  Non-2xx or 3xx responses: 3\n",
	} {
		w, err := mesh.ParseWrk(wrkOut + tail)
		if err != nil {
			t.Fatal(err)
		}
		if err := check(Baseline, sample{wrk: w}); err == nil {
			t.Errorf("%q: no error", tail)
		}
	}
}

func TestCheckAcceleration(t *testing.T) {
	w := mesh.WrkResult{Requests: 1000, RPS: 500}
	acc := func(red, byp float64) sample {
		return sample{wrk: w, acc: counters{redirected: red, pairs: red / 100, bypassed: byp}}
	}
	for _, tc := range []struct {
		cfg string
		s   sample
		ok  bool
	}{
		{Baseline, acc(0, 0), true},
		{ShortcutOnly, acc(8000, 0), true},
		{ShortcutOnly, acc(5000, 0), false},  // too little on the shortcut
		{ShortcutOnly, acc(8000, 10), false}, // the bypass was on
		{BypassOnly, acc(0, 8000), true},
		{BypassOnly, acc(100, 8000), false}, // the shortcut was on
		{BypassOnly, acc(0, 100), false},    // too little bypassed
		{Both, acc(8000, 8000), true},
		{Both, acc(8000, 0), false},
		{Both, acc(0, 8000), false},
		{Both, sample{}, false}, // no request
		{Idle, acc(0, 0), true},
		{Idle, acc(8000, 0), false},
		{Idle, acc(0, 8000), false},
		{IdlePsock, acc(0, 0), true},
		{IdlePsock, acc(8000, 0), false},
	} {
		err := check(tc.cfg, tc.s)
		if (err == nil) != tc.ok {
			t.Errorf("%s %+v: %v, want ok %v", tc.cfg, tc.s.acc, err, tc.ok)
		}
	}
}

func TestRotate(t *testing.T) {
	seen := map[string][]int{}
	for r := range len(configs) {
		order := rotate(configs, r)
		for i, c := range order {
			seen[c] = append(seen[c], i)
		}
	}
	for _, c := range configs {
		p := slices.Clone(seen[c])
		slices.Sort(p)
		if !slices.Equal(p, []int{0, 1, 2, 3}) {
			t.Errorf("%s took places %v in %d rounds", c, seen[c], len(configs))
		}
	}
	if !slices.Equal(configs, []string{Baseline, ShortcutOnly, BypassOnly, Both}) {
		t.Errorf("rotate changed configs: %v", configs)
	}
}

func TestTable(t *testing.T) {
	r := results{}
	// Two rounds; the changes pair samples of the same round, whatever
	// the order they were added in.
	for _, x := range []struct {
		cfg        string
		round      int
		p50, rps   float64
		red, bypkt float64
	}{
		{Baseline, 0, 200, 1000, 0, 0},
		{Baseline, 1, 400, 500, 0, 0},
		{ShortcutOnly, 1, 300, 600, 8, 0},
		{ShortcutOnly, 0, 180, 1100, 8, 0},
		{BypassOnly, 0, 190, 1050, 0, 8},
		{BypassOnly, 1, 380, 520, 0, 8},
		{Both, 0, 150, 1300, 8, 8},
		{Both, 1, 300, 700, 8, 8},
	} {
		w := mesh.WrkResult{Requests: 1000, RPS: x.rps, P50Us: x.p50, AvgUs: x.p50, P90Us: x.p50, P99Us: x.p50}
		// CPU time per request as the latency: 1000 requests, p50 us each.
		cpu := cpuUse{busy: []float64{0.5, 1}, seconds: x.p50 * 1000 / 1e6}
		r.add(x.cfg, 1, sample{round: x.round, wrk: w, acc: counters{redirected: x.red * 1000, bypassed: x.bypkt * 1000}, cpu: cpu})
	}
	var b strings.Builder
	table(&b, r, configs, []int{1})
	got := b.String()
	for _, want := range []string{
		"| c | ",
		"| baseline | shortcut only | bypass only | both |",
		// shortcut only: rounds -10% and -25%: median -17.5%; value median(180, 300) = 240
		"| 240 (-17.5%, -25..-10) |",
		// both: -25% and -25%
		"| 225 (-25.0%, -25..-25) |",
		// RPS both: +30% and +40%
		"| 1000 (+35.0%, +30..+40) |",
		"| CPU per request (us, all CPUs) | 300 | 240 (-17.5%, -25..-10) | 285 (-5.0%, -5..-5) | 225 (-25.0%, -25..-25) |",
		"| busy per CPU (%) | 50/100 | 50/100 | 50/100 | 50/100 |",
		"| shortcut messages / request | 0.0 | 8.0 | 0.0 | 8.0 |",
		"| bypassed packets / request | 0.0 | 0.0 | 8.0 | 8.0 |",
	} {
		if !strings.Contains(squeeze(got), want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if n := strings.Count(got, "\n"); n != 2+len(metrics)+4 {
		t.Errorf("%d lines, want %d:\n%s", n, 2+len(metrics)+4, got)
	}
}

// squeeze drops the padding of a Markdown table's cells.
func squeeze(s string) string {
	for strings.Contains(s, "  ") {
		s = strings.ReplaceAll(s, "  ", " ")
	}
	return s
}

func TestChangeNoBaseline(t *testing.T) {
	x := []sample{{round: 0, wrk: mesh.WrkResult{RPS: 1}}}
	if got := change(nil, x, func(w mesh.WrkResult) float64 { return w.RPS }); got != "-" {
		t.Errorf("change without baseline: %q", got)
	}
}

func TestConfigs(t *testing.T) {
	dir := t.TempDir()
	front, back := netip.MustParseAddr("10.88.2.2"), netip.MustParseAddr("10.88.1.3")
	client := sidecarConfig(netip.Addr{}, front)
	if !strings.Contains(client, "bind 127.0.0.1:15001") || !strings.Contains(client, "server next 10.88.2.2:15006") || strings.Contains(client, "inbound") {
		t.Errorf("client sidecar:\n%s", client)
	}
	fs := sidecarConfig(front, back)
	if !strings.Contains(fs, "bind 10.88.2.2:15006") || !strings.Contains(fs, "server app 127.0.0.1:8080") || !strings.Contains(fs, "server next 10.88.1.3:15006") {
		t.Errorf("front sidecar:\n%s", fs)
	}
	proxy := nginxConfig(dir, true)
	if !strings.Contains(proxy, "proxy_pass http://sidecar;") || !strings.Contains(proxy, "server 127.0.0.1:15001;") || !strings.Contains(proxy, "keepalive 256;") {
		t.Errorf("nginx proxy tier:\n%s", proxy)
	}
	static := nginxConfig(dir, false)
	if !strings.Contains(static, "root "+dir+"/www;") || strings.Contains(static, "proxy_pass") {
		t.Errorf("nginx static:\n%s", static)
	}
	for _, args := range [][]string{agentArgs(Baseline), agentArgs(ShortcutOnly), agentArgs(BypassOnly), agentArgs(Both)} {
		t.Log(args)
	}
	if agentArgs(Baseline) != nil || !slices.Contains(agentArgs(ShortcutOnly), "--bypass=false") ||
		!slices.Contains(agentArgs(BypassOnly), "0.0.0.0/0,::/0") || slices.Contains(agentArgs(Both), "--exclude-cidrs") {
		t.Error("agent flags")
	}
}

func TestCPUSince(t *testing.T) {
	type bt = struct{ busy, total float64 }
	before := cpuTimes{0: bt{10, 100}, 1: bt{50, 100}}
	after := cpuTimes{1: bt{60, 110}, 0: bt{12.5, 110}}
	u := after.since(before)
	if !slices.Equal(u.busy, []float64{0.25, 1}) || u.seconds != 12.5 {
		t.Errorf("got %+v", u)
	}
}

func TestParseConfigs(t *testing.T) {
	got, err := ParseConfigs([]string{"both", "idle-psock", "idle", "shortcut"})
	if err != nil || !slices.Equal(got, []string{Baseline, Idle, IdlePsock, ShortcutOnly, Both}) {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := ParseConfigs([]string{"fast"}); err == nil {
		t.Error("unknown configuration accepted")
	}
	got, err = ParseConfigs([]string{"both", "idle-refuse:ez_sc_nat+ez_sc_nat_dev", "idle", "idle-refuse:ez_sc_recv", "idle-refuse:ez_sc_nat+ez_sc_nat_dev"})
	nat, recv := IdleRefusing("ez_sc_nat", "ez_sc_nat_dev"), IdleRefusing("ez_sc_recv")
	if err != nil || !slices.Equal(got, []string{Baseline, Idle, nat, recv, Both}) {
		t.Errorf("got %v, %v", got, err)
	}
	if !slices.Equal(refusedPrograms(nat), []string{"ez_sc_nat", "ez_sc_nat_dev"}) || refusedPrograms(Idle) != nil || !slices.Equal(refusedPrograms(IdlePsock), bypass.PsockRefusals()) {
		t.Errorf("refused programs %v, %v, %v", refusedPrograms(nat), refusedPrograms(Idle), refusedPrograms(IdlePsock))
	}
	// Idle also where the host leaves IdlePsock nothing to refuse.
	if !slices.Equal(agentArgs(IdlePsock), agentArgs(Idle)) {
		t.Errorf("idle-psock agent flags %v, want idle's %v", agentArgs(IdlePsock), agentArgs(Idle))
	}
	if !slices.Equal(agentArgs(nat), agentArgs(Idle)) {
		t.Errorf("idle-refuse agent flags %v, want idle's %v", agentArgs(nat), agentArgs(Idle))
	}
	for _, bad := range []string{"idle-refuse:", "idle-refuse:ez_sc_nat+", "idle-refuse:a,b", "idle-refuse:X=1"} {
		if _, err := ParseConfigs([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if !slices.Contains(agentArgs(Idle), "--bypass=false") || !slices.Contains(agentArgs(Idle), "0.0.0.0/0,::/0") {
		t.Errorf("idle agent flags %v", agentArgs(Idle))
	}
	if !slices.Equal(agentArgs(IdlePsock), agentArgs(Idle)) {
		t.Errorf("idle-psock agent flags %v, want idle's %v", agentArgs(IdlePsock), agentArgs(Idle))
	}
}
