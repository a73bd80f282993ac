package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// pool is one `eztunnel-lab workload pool` client in a pod: it opens its
// connections and uses them, writes ready, waits for go (or streams until
// stop), and prints a workload.PoolResult.
type pool struct {
	t                *testing.T
	cmd              *exec.Cmd
	out              *logbuf.Buffer
	ready, gof, stop string
}

func (e *env) startPool(p *netlab.Pod, addr string, conns, seed int, extra ...string) *pool {
	e.t.Helper()
	dir := e.t.TempDir()
	pl := &pool{t: e.t, ready: filepath.Join(dir, "ready"), gof: filepath.Join(dir, "go"), stop: filepath.Join(dir, "stop")}
	args := append([]string{"workload", "pool", "--addr", addr, "--conns", strconv.Itoa(conns), "--seed", strconv.Itoa(seed),
		"--ready-file", pl.ready, "--go-file", pl.gof, "--stop-file", pl.stop, "--timeout", "3m"}, extra...)
	pl.cmd, pl.out = e.startLogged(p, labBin, args...)
	return pl
}

func (pl *pool) waitReady() {
	pl.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(pl.ready); err == nil {
			return
		}
		if pl.cmd.ProcessState != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	pl.t.Fatalf("pool client not ready: %s", pl.out.String())
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// finish lets phase 2 run (and end, for a stream) and returns the result,
// failing on any error the client saw.
func (pl *pool) finish() workload.PoolResult {
	pl.t.Helper()
	touch(pl.t, pl.gof)
	touch(pl.t, pl.stop)
	if err := pl.cmd.Wait(); err != nil {
		pl.t.Fatalf("pool client: %v\n%s", err, pl.out.String())
	}
	var res workload.PoolResult
	if err := json.Unmarshal([]byte(pl.out.String()), &res); err != nil {
		pl.t.Fatalf("pool result: %v\n%s", err, pl.out.String())
	}
	if len(res.Errors) > 0 || res.BytesBack != res.BytesUp || res.SHA256Up != res.SHA256Bk || res.BytesUp == 0 {
		pl.t.Fatalf("pool streams not byte-exact: %+v", res)
	}
	return res
}

func (e *env) adopt() datapath.AdoptReport {
	e.t.Helper()
	rep, err := e.dp.Adopt([]string{e.lab.Managed})
	if err != nil {
		e.t.Fatalf("adoption round: %v", err)
	}
	return rep
}

// adoptUntil runs rounds until want connections were adopted since before (at most 20).
func (e *env) adoptUntil(before datapath.Counters, want uint64) datapath.Counters {
	e.t.Helper()
	var d datapath.Counters
	for i := 0; i < 20; i++ {
		rep := e.adopt()
		d = delta(before, e.counters())
		e.t.Logf("round %d: %+v", i, rep)
		if d["adopted"] >= want {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return d
}

func adoptedConnections(t *testing.T, cfg datapath.Config) (adopted, all int) {
	t.Helper()
	conns, err := datapath.Connections(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if c.Adopted {
			adopted++
		}
	}
	return adopted, len(conns)
}

// TestAdoptIdlePools: pools opened and used before the datapath exists,
// over IPv4 and IPv6 between two pods and over loopback inside one, are
// adopted when idle, and both directions stay byte-exact afterwards, with
// the same streams as the same pools on plain TCP.
func TestAdoptIdlePools(t *testing.T) {
	e := newEnv(t, "adopt", 61)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--pool", ":7300")
	e.serve(a, "--pool", "127.0.0.1:7301")
	targets := []string{hostport(b.IPv4, 7300), hostport(b.IPv6, 7300), "127.0.0.1:7301"}

	const conns = 10
	// Plain TCP first: the streams each seed gives.
	var plain []workload.PoolResult
	for i, addr := range targets {
		pl := e.startPool(a, addr, conns, 10+i, "--fionread")
		pl.waitReady()
		plain = append(plain, pl.finish())
	}
	// --fionread: after adoption every echo but each connection's first
	// must show whole in FIONREAD before it is read, as on plain TCP. The
	// first goes on the kernel path until each end has read (splice.h),
	// and 6.18's FIONREAD counts only an enrolled socket's psock bytes.
	var pools []*pool
	for i, addr := range targets {
		pl := e.startPool(a, addr, conns, 10+i, "--fionread")
		pools = append(pools, pl)
	}
	for _, pl := range pools {
		pl.waitReady()
	}
	e.accelerate()
	before := e.counters()
	want := uint64(conns * len(targets))
	// A round skips a connection whose last bytes are not acknowledged yet
	// (a delayed ACK): later rounds take it.
	d := e.adoptUntil(before, want)
	if d["adopted"] != want {
		t.Fatalf("adopted %d of %d idle connections: %+v", d["adopted"], want, d)
	}
	if n, all := adoptedConnections(t, e.cfg); n != 2*int(want) || all != n {
		t.Fatalf("connections lists %d adopted ends of %d, want %d", n, all, 2*want)
	}
	before = e.counters()
	for i, pl := range pools {
		res := pl.finish()
		if res.SHA256Up != plain[i].SHA256Up || res.SHA256Bk != plain[i].SHA256Bk || res.BytesUp != plain[i].BytesUp {
			t.Errorf("%s: adopted streams differ from plain TCP's: %+v vs %+v", targets[i], res, plain[i])
		}
	}
	d = delta(before, e.counters())
	if d["bytes_redirected"] == 0 || d["adopt_late_stack"] != 0 || d["fallback_backpressure"] != 0 {
		t.Fatalf("after adoption: %+v", d)
	}
}

// TestAdoptSkips: connections adoption must leave alone, each left on the
// kernel path, counted, and working exactly as plain TCP afterwards: a
// server thread asleep in a plain read(2) (it would never see a redirected
// byte), an echo the client has not read yet (it would be overtaken), and a
// peer outside the managed cgroups.
func TestAdoptSkips(t *testing.T) {
	e := newEnv(t, "adoptb", 62)
	a, b := e.pod("a", true), e.pod("b", true)
	u := e.pod("u", false)
	e.serve(b, "--pool-blocking", ":7400", "--pool", ":7300")
	e.serve(u, "--pool", ":7300")
	const conns = 5
	cases := []struct {
		name, addr, counter string
		extra               []string
	}{
		{"blocked-reader", hostport(b.IPv4, 7400), "adopt_skipped_busy", nil},
		{"unread-data", hostport(b.IPv4, 7300), "adopt_skipped_busy", []string{"--unread"}},
		{"unmanaged-peer", hostport(u.IPv4, 7300), "adopt_skipped_no_peer", nil},
	}
	var pools []*pool
	for i, c := range cases {
		pl := e.startPool(a, c.addr, conns, 40+i, c.extra...)
		pools = append(pools, pl)
	}
	for _, pl := range pools {
		pl.waitReady()
	}
	e.accelerate()
	before := e.counters()
	const rounds = 3
	for range rounds {
		rep := e.adopt()
		t.Logf("round: %+v", rep)
	}
	d := delta(before, e.counters())
	if d["adopted"] != 0 {
		t.Fatalf("adopted %d connections that must be left alone: %+v", d["adopted"], d)
	}
	// Each round counts each connection once; the busy ones under one counter.
	if d["adopt_skipped_busy"] != 2*conns*rounds || d["adopt_skipped_no_peer"] != conns*rounds {
		t.Errorf("skips per round: busy %d, want %d; no peer %d, want %d", d["adopt_skipped_busy"], 2*conns*rounds,
			d["adopt_skipped_no_peer"], conns*rounds)
	}
	for _, pl := range pools {
		pl.finish()
	}
}

// TestAdoptRacingBlockingReaders: threads loop in blocking recv with
// SO_RCVTIMEO 1 ms, with a request every few ms, while adoption rounds run
// back to back: rounds mostly find a sleeper and skip, sometimes adopt in
// between; nothing is lost, reordered or hung either way.
func TestAdoptRacingBlockingReaders(t *testing.T) {
	e := newEnv(t, "adrace", 76)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--pool", ":7300")
	pl := e.startPool(a, hostport(b.IPv4, 7300), 20, 50, "--blocking")
	pl.waitReady()
	e.accelerate()
	before := e.counters()
	touch(t, pl.gof)
	// Rounds for 3 s, and on (up to a minute, scaled) until one found a gap
	// between two receives: on a loaded machine the threads may sleep
	// through many rounds.
	start, limit := time.Now(), scaled(time.Minute)
	for time.Since(start) < 3*time.Second || (delta(before, e.counters())["adopted"] == 0 && time.Since(start) < limit) {
		e.adopt()
		time.Sleep(5 * time.Millisecond)
	}
	res := pl.finish()
	d := delta(before, e.counters())
	t.Logf("adopted %d, skipped busy %d in %s of rounds; %d bytes each way", d["adopted"], d["adopt_skipped_busy"], time.Since(start).Round(time.Millisecond), res.BytesUp)
	checkLateStack(t, d)
	if d["adopted"] == 0 {
		t.Errorf("no connection was adopted in %s of rounds: the race with blocking readers was not exercised", limit)
	}
}

// TestAdoptWhileStreaming: 100 connections stream both ways in bursts with
// short pauses while adoption rounds run back to back. Each connection is
// adopted at a quiet moment or left alone; none is corrupted or reordered
// (every echoed byte is checked, and the SHA-256 of both directions).
func TestAdoptWhileStreaming(t *testing.T) {
	var adopted, busy uint64
	for round := range 3 {
		t.Run(strconv.Itoa(round), func(t *testing.T) {
			e := newEnv(t, "adst"+strconv.Itoa(round), 70+round)
			a, b := e.pod("a", true), e.pod("b", true)
			e.serve(b, "--pool", ":7300")
			pl := e.startPool(a, hostport(b.IPv4, 7300), 100, 100+round, "--stream", "--max-gap", "20ms")
			pl.waitReady()
			e.accelerate()
			before := e.counters()
			touch(t, pl.gof)
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
				e.adopt()
				time.Sleep(10 * time.Millisecond)
			}
			res := pl.finish()
			d := delta(before, e.counters())
			t.Logf("adopted %d, skipped busy %d, unsupported %d; %d bytes each way, %d redirected",
				d["adopted"], d["adopt_skipped_busy"], d["adopt_skipped_unsupported"], res.BytesUp, d["bytes_redirected"])
			checkLateStack(t, d)
			adopted += d["adopted"]
			busy += d["adopt_skipped_busy"]
		})
	}
	if adopted == 0 || busy == 0 {
		t.Errorf("3 rounds of 100 bursty streams: adopted %d, skipped busy %d: the test exercised only one side", adopted, busy)
	}
}

// checkLateStack: with sends in flight while rounds run, a send may race
// an insert; the connection then switches back to the kernel path
// (adopt_late_stack, docs/families/shortcut-design.md, Adoption residuals), and the
// caller checks every byte. The window is a few instructions: more than a
// tenth of the adopted connections means the adoption steps are broken.
// Idle pools (no send in flight) require 0.
func checkLateStack(t *testing.T, d map[string]uint64) {
	t.Helper()
	n := d["adopt_late_stack"]
	if n == 0 {
		return
	}
	t.Logf("%d adopted connections switched back: a send raced the insert", n)
	if n*10 > d["adopted"] {
		t.Errorf("%d of %d adopted connections had a send race the insert: %+v", n, d["adopted"], d)
	}
}

// TestAdoptThroughDNAT: pools opened before the datapath through a DNAT in
// the client pod's netns and through a kube-proxy-style DNAT in the host:
// conntrack links the client's tuple to the server's, and they are adopted
// and stay byte-exact, with the streams of the same pools on plain TCP.
func TestAdoptThroughDNAT(t *testing.T) {
	e := newEnv(t, "adnat", 73)
	a, b, k := e.pod("a", true), e.pod("b", true), e.pod("k", true)
	e.serve(b, "--pool", ":7300")
	e.serve(k, "--pool", ":7300")
	for _, p := range []*netlab.Pod{a, b, k} {
		noRedirects(t, p)
	}
	podDNAT(t, a, podVIP, hostport(b.IPv4, 7300))
	hostDNAT(t, e.lab, hostVIP, hostport(k.IPv4, 7300))
	nsExec(t, k.NetNS, "ip", "route", "add", a.IPv4.String()+"/32", "via", e.lab.GatewayV4.String())
	targets := []string{hostport(podVIP, 80), hostport(hostVIP, 80)}
	const conns = 8
	var plain []workload.PoolResult
	for i, addr := range targets {
		pl := e.startPool(a, addr, conns, 20+i)
		pl.waitReady()
		plain = append(plain, pl.finish())
	}
	var pools []*pool
	for i, addr := range targets {
		pools = append(pools, e.startPool(a, addr, conns, 20+i))
	}
	for _, pl := range pools {
		pl.waitReady()
	}
	e.accelerate()
	before := e.counters()
	want := uint64(conns * len(targets))
	if d := e.adoptUntil(before, want); d["adopted"] != want || d["adopt_skipped_nat_unknown"] != 0 {
		t.Fatalf("adopted %d of %d NAT-ed idle connections: %+v", d["adopted"], want, d)
	}
	// Every connection is in: a round has no socket to match, so it reads
	// no conntrack table (a node's can hold a million flows); a round with
	// sockets to match read them above (no nat_unknown skip).
	if rep := e.adopt(); rep.NATRead || rep.Sockets != 0 || rep.Candidates != 0 {
		t.Fatalf("a round with every connection adopted: %+v, want no socket, no candidate, no NAT read", rep)
	}
	for i, pl := range pools {
		if res := pl.finish(); res.SHA256Up != plain[i].SHA256Up || res.SHA256Bk != plain[i].SHA256Bk {
			t.Errorf("%s: adopted streams differ from plain TCP's", targets[i])
		}
	}
	if d := delta(before, e.counters()); d["bytes_redirected"] == 0 || d["adopt_late_stack"] != 0 {
		t.Fatalf("after adoption: %+v", d)
	}
}

// TestAdoptAgentLifecycle: the agent adopts a pool opened before it
// (`eztunnel adopt` asks for rounds until all are in); the adopted pool then
// streams while the agent is killed, restarted and finally uninstalled, and
// stays byte-exact: an adopted pair is a pair like any other.
func TestAdoptAgentLifecycle(t *testing.T) {
	e, a, b, pin := agentEnv(t, "adagt", 74)
	e.serve(b, "--pool", ":7300")
	const conns = 20
	pl := e.startPool(a, hostport(b.IPv4, 7300), conns, 7, "--stream", "--max-gap", "2ms")
	pl.waitReady()
	lock := filepath.Join(t.TempDir(), "agent.lock")
	ag := startAgent(t, bin, e.lab.Managed, pin, "--lock-file", lock, "--adopt-interval", "0")
	var adopted uint64
	for i := 0; i < 20 && adopted < conns; i++ {
		out, err := eztunnelOut("adopt", "--pin-path", pin, "--lock-file", lock, "-o", "json")
		if err != nil {
			t.Fatalf("eztunnel adopt: %v\n%s\n%s", err, out, ag.logs.String())
		}
		adopted = pinnedCounters(t, pin)["adopted"]
		time.Sleep(50 * time.Millisecond)
	}
	if adopted != conns {
		t.Fatalf("agent adopted %d of %d: %s", adopted, conns, ag.logs.String())
	}
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = pin
	if n, all := adoptedConnections(t, cfg); n != 2*conns || all != n {
		t.Fatalf("connections lists %d adopted ends of %d", n, all)
	}
	touch(t, pl.gof)
	redirected := func() uint64 { return pinnedCounters(t, pin)["bytes_redirected"] }
	waitGrowth := func(what string) {
		t.Helper()
		from := redirected()
		for deadline := time.Now().Add(scaled(10 * time.Second)); redirected() < from+(8<<20); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the adopted pool is not being accelerated", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitGrowth("after adoption")
	ag.kill(t)
	waitGrowth("agent killed")
	// Adoption runs in the agent, with its selection: without one, a clear error.
	if out, err := eztunnelOut("adopt", "--pin-path", pin, "--lock-file", lock); err == nil || !strings.Contains(out, "no agent is running") {
		t.Errorf("eztunnel adopt without an agent: %v\n%s", err, out)
	}
	if out, err := eztunnelOut("adopt", "--pin-path", pin, "--lock-file", lock, "--timeout", "0s"); err == nil || !strings.Contains(out, "--timeout 0s must be positive") {
		t.Errorf("eztunnel adopt --timeout 0s: %v\n%s", err, out)
	}
	startAgent(t, bin, e.lab.Managed, pin, "--lock-file", lock, "--adopt-interval", "0")
	waitGrowth("agent restarted")
	if out, err := eztunnelOut("uninstall", "--pin-path", pin, "--lock-file", lock, "--drain-timeout", "10s"); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	time.Sleep(300 * time.Millisecond) // the pool streams on the kernel path now
	pl.finish()
}

// TestAdoptThroughSidecars: a pool through Istio-style HAProxy sidecars
// opened before the datapath (three TCP legs per connection: app -> proxy A
// by REDIRECT in A's OUTPUT, proxy A -> proxy B by REDIRECT in B's
// PREROUTING, proxy B -> app on loopback). Every leg is adopted, linked
// through the pods' conntrack, and the streams equal plain TCP's.
func TestAdoptThroughSidecars(t *testing.T) {
	e := newEnv(t, "adside", 75)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--pool", ":7300")
	for _, p := range []*netlab.Pod{a, b} {
		if err := meshlab.InstallCapture(context.Background(), p, meshlab.SidecarCapture()); err != nil {
			t.Fatal(err)
		}
		e.startSidecar(p)
	}
	const conns = 8
	addr := hostport(b.IPv4, 7300)
	plainPool := e.startPool(a, addr, conns, 30)
	plainPool.waitReady()
	plain := plainPool.finish()
	pl := e.startPool(a, addr, conns, 30)
	pl.waitReady()
	e.accelerate()
	before := e.counters()
	if d := e.adoptUntil(before, 3*conns); d["adopted"] != 3*conns {
		t.Fatalf("adopted %d of %d legs: %+v", d["adopted"], 3*conns, d)
	}
	if res := pl.finish(); res.SHA256Up != plain.SHA256Up || res.SHA256Bk != plain.SHA256Bk {
		t.Errorf("adopted streams through the sidecars differ from plain TCP's")
	}
	if d := delta(before, e.counters()); d["bytes_redirected"] == 0 || d["adopt_late_stack"] != 0 {
		t.Fatalf("after adoption: %+v", d)
	}
}

// TestAdoptInterruptedRound: a round stopped after its insert pass (as an
// agent killed there leaves it: pairs activated, one end of each not settled,
// records pinned) is finished by the next round: every pair stays adopted
// and on the shortcut, and its streams stay byte-exact.
func TestAdoptInterruptedRound(t *testing.T) {
	e := newEnv(t, "adint", 77)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--pool", ":7300")
	const conns = 10
	pl := e.startPool(a, hostport(b.IPv4, 7300), conns, 80, "--fionread")
	pl.waitReady()
	e.accelerate()
	before := e.counters()
	sc := e.dp.Shortcut()
	sc.InterruptAdoptionAfter(2)
	for i := 0; i < 20 && delta(before, e.counters())["adopted"] < conns; i++ {
		e.adopt()
		time.Sleep(50 * time.Millisecond)
	}
	if d := delta(before, e.counters()); d["adopted"] != conns {
		t.Fatalf("interrupted rounds adopted %d of %d: %+v", d["adopted"], conns, d)
	}
	sc.InterruptAdoptionAfter(3)
	e.adopt()
	if n, all := adoptedConnections(t, e.cfg); n != 2*conns || all != n {
		t.Fatalf("after the next round: %d adopted ends listed of %d, want %d", n, all, 2*conns)
	}
	mid := e.counters()
	res := pl.finish()
	d := delta(mid, e.counters())
	// Phase 2 is about half of BytesUp, each byte redirected twice (up and
	// back): a broken pair would redirect nothing.
	if d["bytes_redirected"] < uint64(res.BytesUp)/2 || d["fallback_peer_gone"] != 0 {
		t.Fatalf("the pairs left the shortcut: %d bytes redirected for %d each way: %+v", d["bytes_redirected"], res.BytesUp, d)
	}
}
