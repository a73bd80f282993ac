package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
)

// TestObservability: the agent's Prometheus endpoint reports the BPF
// counters, `connections` lists both ends of a live connection (also with the
// agent stopped), logs are JSON lines, and flags can come from EZTUNNEL_*.
func TestObservability(t *testing.T) {
	e := newEnv(t, "obs", 23)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000", "--echo", ":7001")
	pin := e.cfg.PinRoot
	t.Cleanup(func() { eztunnel(context.Background(), "uninstall", "--pin-path", pin, "--drain-timeout", "10s") })

	metricsAddr := freeAddr(t)
	ready := filepath.Join(t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := sysexec.Command(ctx, bin, "run", "--cgroup", e.lab.Managed, "--pin-path", pin,
		"--metrics-addr", metricsAddr, "--log-format", "json", "--ready-file", ready)
	logs := &logbuf.Buffer{}
	agent.Stdout, agent.Stderr = logs, logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	agentDone := false
	defer func() {
		if !agentDone {
			agent.Process.Kill()
			agent.Wait()
		}
	}()
	waitFile(t, ready, logs.String)

	const conns = 6
	if out, err := e.run(a, streamCase{conns: conns, parallel: conns, up: 1 << 20, down: 1 << 20, chunk: 65536, handshake: true}.args(hostport(b.IPv4, 7000), 5)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}

	// One archive for an issue: the running agent's version, its recent
	// log (JSON lines) and the pinned programs.
	t.Run("bugreport", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "report.tar.gz")
		if out, err := eztunnel(context.Background(), "bugreport", "--pin-path", pin, "-f", file); err != nil {
			t.Fatalf("bugreport: %v\n%s", err, out)
		}
		out, err := sysexec.Command(context.Background(), "tar", "-xzOf", file, "eztunnel-bugreport/agent.log", "eztunnel-bugreport/pins.txt", "eztunnel-bugreport/version.json").CombinedOutput()
		if err != nil {
			t.Fatalf("tar: %v\n%s", err, out)
		}
		for _, want := range []string{`"msg":`, "\tprogram SockOps ez_sc_sockops", "\tmap SockHash", `"holder":`} {
			if !strings.Contains(string(out), want) {
				t.Errorf("the bug report lacks %q:\n%s", want, out)
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		// The agent's whole registry follows Prometheus' conventions.
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		problems, err := promlint.New(resp.Body).Lint()
		resp.Body.Close()
		if err != nil || len(problems) > 0 {
			t.Errorf("promlint: %v %v", err, problems)
		}
		m := scrape(t, metricsAddr)
		c := pinnedCounters(t, pin)
		requirePaired(t, c, conns, 1, "the stream connections")
		if v, ok := m["eztunnel_pairs_total"]; !ok || v != float64(c["pairs"]) {
			t.Errorf("eztunnel_pairs_total = %v (present %v), want the pinned counter %d", v, ok, c["pairs"])
		}
		// The metric is the pinned counter. The streams open with a
		// request/response (--handshake), so the reader gate
		// (bpf/shortcut/splice.h) has opened both directions of each pair
		// at their first stream byte, whatever the timing: all 2 MiB of
		// each pair are redirected. (Pipelined streams open only when the
		// reader catches up: a bound on them would measure the timing.)
		if v := m["eztunnel_bytes_redirected_total"]; v != float64(c["bytes_redirected"]) || v < float64(c["pairs"]*2<<20) {
			t.Errorf("eztunnel_bytes_redirected_total = %v, want the pinned counter %d and at least %d (2 MiB per pair)", v, c["bytes_redirected"], c["pairs"]*2<<20)
		}
		for _, reason := range []string{"no_local_peer", "ambiguous", "map_full", "other"} {
			if _, ok := m[`eztunnel_fallbacks_total{reason="`+reason+`"}`]; !ok {
				t.Errorf("eztunnel_fallbacks_total{reason=%q} missing", reason)
			}
		}
		// peer_gone counts messages: its own metric, not a connection reason.
		if _, ok := m[`eztunnel_fallback_messages_total{reason="peer_gone"}`]; !ok {
			t.Error(`eztunnel_fallback_messages_total{reason="peer_gone"} missing`)
		}
		if _, ok := m[`eztunnel_fallbacks_total{reason="peer_gone"}`]; ok {
			t.Error(`eztunnel_fallbacks_total{reason="peer_gone"}: messages among connections`)
		}
		for _, name := range []string{"eztunnel_sockets_enrolled_total", "eztunnel_messages_redirected_total", "eztunnel_handshakes_total",
			"eztunnel_nat_aliases_total", "eztunnel_sockets_released_total", `eztunnel_map_entries{map="sockets"}`} {
			if _, ok := m[name]; !ok {
				t.Errorf("%s missing", name)
			}
		}
		if v := m[`eztunnel_map_max_entries{map="sockets"}`]; v != float64(datapath.DefaultConfig().MaxSockets) {
			t.Errorf(`eztunnel_map_max_entries{map="sockets"} = %v`, v)
		}
		ver := binVersion(t)
		if ver != buildVersion {
			t.Errorf("the agent reports version %q, built with %q", ver, buildVersion)
		}
		if v := m[`eztunnel_agent_info{schema="`+datapath.Schema+`",version="`+ver+`"}`]; v != 1 {
			t.Errorf("eztunnel_agent_info{version=%q} missing: %v", ver, m)
		}
	})

	// A long-lived connection: ping-pong for far longer than the test looks.
	pp := e.startIn(a, labBin, "workload", "pingpong", "--addr", hostport(b.IPv4, 7001), "--n", "20000000", "--warmup", "0")
	listed := func(t *testing.T) (client, server datapath.Connection) {
		t.Helper()
		deadline := time.Now().Add(scaled(10 * time.Second))
		for {
			client, server = connectionOn(t, pin, 7001)
			if client.TxBytes > 0 && server.TxBytes > 0 || time.Now().After(deadline) {
				return client, server
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	checkEnds := func(t *testing.T, client, server datapath.Connection) {
		t.Helper()
		if client.Cookie == 0 || server.Cookie == 0 {
			t.Fatalf("connection to :7001 not listed with both ends: client %+v server %+v", client, server)
		}
		if client.PeerCookie != server.Cookie || server.PeerCookie != client.Cookie {
			t.Errorf("ends do not point at each other: client %+v server %+v", client, server)
		}
		if client.Client != server.Client || client.Server != server.Server || client.Client.Addr() != a.IPv4 || client.Server.Addr() != b.IPv4 {
			t.Errorf("addresses: client end %s->%s, server end %s->%s", client.Client, client.Server, server.Client, server.Server)
		}
		if client.TxBytes == 0 || server.TxBytes == 0 || client.TxMsgs == 0 || server.TxMsgs == 0 {
			t.Errorf("no bytes redirected: client %+v server %+v", client, server)
		}
		if client.NetnsCookie == 0 || client.NetnsCookie == server.NetnsCookie {
			t.Errorf("netns cookies: client %d server %d", client.NetnsCookie, server.NetnsCookie)
		}
		if want := netnsInode(t, a.NetNS); client.NetnsInode != want {
			t.Errorf("client netns inode %d, want %d (pod a)", client.NetnsInode, want)
		}
		if want := netnsInode(t, b.NetNS); server.NetnsInode != want {
			t.Errorf("server netns inode %d, want %d (pod b)", server.NetnsInode, want)
		}
	}
	t.Run("connections", func(t *testing.T) {
		c, s := listed(t) // from the agent's local API
		checkEnds(t, c, s)
		checkCgroups(t, c, s, a.Cgroup, b.Cgroup)
		table, err := eztunnel(ctx, "connections", "--pin-path", pin)
		if err != nil || !strings.Contains(table, "COOKIE") || !strings.Contains(table, strconv.FormatUint(c.Cookie, 10)) {
			t.Errorf("table output (err %v):\n%s", err, table)
		}
		// The same ends read from the pins by the command itself; by the
		// per-namespace iterator, which runs where a kernel refuses
		// map-element iterators to this process; and, where that iterator
		// cannot enter the pods' namespaces either (no CAP_SYS_ADMIN, as
		// in a pod with the chart's capabilities), from the connection
		// index, without tx counters.
		refuseAll := []string{bpfsys.TestRefuseEnv + "=ez_sc_conns_all"}
		for _, how := range []struct {
			env     []string
			wrap    []string
			indexed bool
		}{
			{nil, nil, false},
			{refuseAll, nil, false},
			{refuseAll, []string{"setpriv", "--bounding-set", "-sys_admin", "--"}, true},
		} {
			dc, ds := connectionOnWith(t, pin, 7001, how.env, how.wrap, "--from-pins")
			if dc.Cookie != c.Cookie || ds.Cookie != s.Cookie || dc.PeerCookie != s.Cookie || ds.PeerCookie != c.Cookie ||
				dc.CgroupID != c.CgroupID || ds.CgroupID != s.CgroupID || dc.NetnsInode != c.NetnsInode || ds.NetnsInode != s.NetnsInode ||
				dc.Client != c.Client || ds.Server != s.Server || dc.RxBound != c.RxBound || ds.RxBound != s.RxBound {
				t.Errorf("%v %v: client %+v server %+v, the agent listed client %+v server %+v", how.env, how.wrap, dc, ds, c, s)
			}
			if dc.Indexed != how.indexed || ds.Indexed != how.indexed || how.indexed && (dc.TxBytes != 0 || ds.TxBytes != 0) {
				t.Errorf("%v %v: indexed %v/%v (tx %d/%d), want %v", how.env, how.wrap, dc.Indexed, ds.Indexed, dc.TxBytes, ds.TxBytes, how.indexed)
			}
		}
	})

	t.Run("status asks the agent", func(t *testing.T) {
		out, err := eztunnel(ctx, "status", "-o", "json", "--pin-path", pin)
		if err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		var st struct {
			AgentView *struct {
				PID        int             `json:"pid"`
				Kubernetes json.RawMessage `json:"kubernetes"`
			} `json:"agent_view"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil || st.AgentView == nil || st.AgentView.PID != agent.Process.Pid || st.AgentView.Kubernetes != nil {
			t.Fatalf("agent_view %+v (err %v), want pid %d in plain mode:\n%s", st.AgentView, err, agent.Process.Pid, out)
		}
		table, err := eztunnel(ctx, "status", "--pin-path", pin)
		if err != nil || !regexp.MustCompile(fmt.Sprintf(`agent api +pid %d,`, agent.Process.Pid)).MatchString(table) || !regexp.MustCompile(`\nkubernetes +off`).MatchString(table) {
			t.Errorf("status table (err %v):\n%s", err, table)
		}
	})

	agent.Process.Signal(syscall.SIGTERM)
	err := agent.Wait()
	agentDone = true
	if err != nil {
		t.Fatalf("agent exit: %v\n%s", err, logs.String())
	}

	t.Run("connections with the agent stopped", func(t *testing.T) {
		if _, err := os.Stat(e.cfg.Layout().Socket()); !os.IsNotExist(err) {
			t.Errorf("the stopped agent left its socket %s: %v", e.cfg.Layout().Socket(), err)
		}
		c, s := listed(t)
		checkEnds(t, c, s)
		checkCgroups(t, c, s, a.Cgroup, b.Cgroup)
	})
	pp.Process.Kill()

	t.Run("json logs", func(t *testing.T) {
		lines := 0
		sc := bufio.NewScanner(strings.NewReader(logs.String()))
		for sc.Scan() {
			var rec map[string]any
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Errorf("log line is not JSON: %q", sc.Text())
				continue
			}
			if rec["level"] == nil || rec["msg"] == nil || rec["time"] == nil {
				t.Errorf("log line lacks time/level/msg: %q", sc.Text())
			}
			lines++
		}
		if lines < 2 || !strings.Contains(logs.String(), `"msg":"serving metrics"`) {
			t.Errorf("expected the agent's start and metrics lines:\n%s", logs.String())
		}
	})

	t.Run("env", func(t *testing.T) {
		run := func(env string, args ...string) string {
			cmd := sysexec.Command(context.Background(), bin, append([]string{"run", "--cgroup", e.lab.Managed, "--pin-path", pin + "-env"}, args...)...)
			cmd.Env = append(os.Environ(), env)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("%s: run succeeded", env)
			}
			return string(out)
		}
		// How variables bind to flags is unit-tested (internal/cli); here:
		// the agent binary reads them at all.
		if out := run("EZTUNNEL_MAX_SOCKETS=1"); !strings.Contains(out, "max sockets 1") {
			t.Errorf("EZTUNNEL_MAX_SOCKETS=1 was not applied:\n%s", out)
		}
		if _, err := os.Stat(pin + "-env"); !os.IsNotExist(err) {
			t.Errorf("a failed run left pins in %s-env", pin)
		}
	})
}

// freeAddr returns a 127.0.0.1 address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrape fetches /metrics, parses it with expfmt and returns every
// eztunnel_* sample by its series, name{label="value",...} with the labels
// sorted by name (a histogram without labels as name_count and name_sum).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	return scrapeWith(t, http.DefaultClient, addr)
}

// scrapeWith is scrape through client (for example one that dials in a
// node's namespace).
func scrapeWith(t *testing.T, client *http.Client, addr string) map[string]float64 {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		if !strings.HasPrefix(name, "eztunnel_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(labels)
			series := name
			if len(labels) > 0 {
				series += "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[series] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[series] = m.GetGauge().GetValue()
			case m.Untyped != nil:
				out[series] = m.GetUntyped().GetValue()
			case m.Histogram != nil:
				out[name+"_count"] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"] = m.GetHistogram().GetSampleSum()
			default:
				t.Fatalf("%s: unexpected metric type %v", series, f.GetType())
			}
		}
	}
	return out
}

// binVersion is the version the agent binary reports (`--version`).
func binVersion(t *testing.T) string {
	t.Helper()
	out, err := sysexec.Command(context.Background(), bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	f := strings.Fields(string(out))
	if len(f) == 0 {
		t.Fatalf("%s --version printed nothing", bin)
	}
	return f[len(f)-1]
}

// connectionOn returns the client and server ends of the accelerated
// connection to server port port, as `connections -o json` lists them.
func connectionOn(t *testing.T, pin string, port uint16) (client, server datapath.Connection) {
	t.Helper()
	return connectionOnWith(t, pin, port, nil, nil)
}

// connectionOnWith is connectionOn with env added to the command's, the
// command run by wrap (a command line ending before the program) and args
// added to its command line.
func connectionOnWith(t *testing.T, pin string, port uint16, env, wrap []string, args ...string) (client, server datapath.Connection) {
	t.Helper()
	argv := append(append(wrap, bin, "connections", "-o", "json", "--pin-path", pin), args...)
	cmd := sysexec.Command(context.Background(), argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	out := string(outb) + stderr.String()
	if err != nil {
		t.Fatalf("connections: %v\n%s", err, out)
	}
	var conns []datapath.Connection
	if err := json.Unmarshal(outb, &conns); err != nil {
		t.Fatalf("connections json: %v\n%s", err, out)
	}
	for _, c := range conns {
		if c.Server.Port() != port {
			continue
		}
		switch c.Role {
		case "client":
			client = c
		case "server":
			server = c
		default:
			t.Errorf("role %q", c.Role)
		}
	}
	return client, server
}

// checkCgroups: each end carries its own pod's cgroup (the listing names
// pods by it).
func checkCgroups(t *testing.T, client, server datapath.Connection, clientCg, serverCg string) {
	t.Helper()
	for _, end := range []struct {
		c  datapath.Connection
		cg string
	}{{client, clientCg}, {server, serverCg}} {
		id, err := cgroupv2.ID(end.cg)
		if err != nil {
			t.Fatal(err)
		}
		if end.c.CgroupID != id {
			t.Errorf("%s end: cgroup id %d, want %d (%s)", end.c.Role, end.c.CgroupID, id, end.cg)
		}
	}
}

func netnsInode(t *testing.T, name string) uint32 {
	t.Helper()
	fi, err := os.Stat("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatal(fmt.Errorf("no stat_t for %s", name))
	}
	return uint32(st.Ino)
}
