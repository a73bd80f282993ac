package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// nsExec runs a command in a network namespace (no cgroup: iptables, sysctl,
// ip) and fails the test with its output when it fails.
func nsExec(t *testing.T, netns string, name string, args ...string) string {
	t.Helper()
	out, err := nsTry(netns, name, args...)
	if err != nil {
		t.Fatalf("%s %s in %s: %v\n%s", name, strings.Join(args, " "), netns, err, out)
	}
	return out
}

// nsTry runs a command in a network namespace, or in the host's when netns
// is "", and returns its combined output.
func nsTry(netns string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cmd *exec.Cmd
	if netns == "" {
		cmd = sysexec.Command(ctx, name, args...)
	} else {
		cmd = netlab.NetnsCmd(ctx, netns, name, args...)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// startLogged is startIn with the command's output kept for diagnostics.
func (e *env) startLogged(p *netlab.Pod, name string, args ...string) (*exec.Cmd, *logbuf.Buffer) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := p.Cmd(ctx, name, args...)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := p.Start(cmd); err != nil {
		cancel()
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cancel(); cmd.Wait() })
	return cmd, out
}

// sidecar is one pod's running HAProxy.
type sidecar struct {
	pod   *netlab.Pod
	stats string // stats socket path
	log   *logbuf.Buffer
}

// startSidecar writes the config, starts `haproxy -f cfg -db` in the pod's
// cgroup and netns and waits until both listeners and the stats socket
// answer.
func (e *env) startSidecar(p *netlab.Pod) *sidecar {
	e.t.Helper()
	dir := e.t.TempDir()
	cfg := filepath.Join(dir, "haproxy.cfg")
	s := &sidecar{pod: p, stats: filepath.Join(dir, "stats.sock")}
	if err := os.WriteFile(cfg, []byte(meshlab.SidecarConfig(false, "", s.stats)), 0o644); err != nil {
		e.t.Fatal(err)
	}
	if out, err := sysexec.Command(context.Background(), "haproxy", "-c", "-f", cfg).CombinedOutput(); err != nil {
		e.t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	cmd, log := e.startLogged(p, "haproxy", "-f", cfg, "-db")
	s.log = log
	deadline := time.Now().Add(scaled(10 * time.Second))
	for {
		missing, lerr := p.NotListening([]int{meshlab.PortOutbound, meshlab.PortInbound})
		_, err := s.showStat()
		if lerr == nil && len(missing) == 0 && err == nil {
			break
		}
		if cmd.ProcessState != nil || time.Now().After(deadline) {
			e.t.Fatalf("haproxy in %s did not come up (not listening: %v %v, stats: %v):\n%s", p.Name, missing, lerr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s
}

// showStat returns `show stat` as proxy/server -> column -> value.
func (s *sidecar) showStat() (map[string]map[string]string, error) {
	c, err := net.DialTimeout("unix", s.stats, time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "show stat\n"); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(c)
	var cols []string
	res := map[string]map[string]string{}
	for sc.Scan() {
		line := sc.Text()
		if h, ok := strings.CutPrefix(line, "# "); ok {
			cols = strings.Split(h, ",")
			continue
		}
		if line == "" || cols == nil {
			continue
		}
		f := strings.Split(line, ",")
		row := map[string]string{}
		for i, c := range cols {
			if i < len(f) {
				row[c] = f[i]
			}
		}
		res[row["pxname"]+"/"+row["svname"]] = row
	}
	if cols == nil {
		return nil, fmt.Errorf("no stats header")
	}
	return res, sc.Err()
}

// sessionsOf returns the total sessions (stot) of every frontend and
// server of every proxy, as "pod proxy/server".
func sessionsOf(t *testing.T, proxies map[string]*sidecar) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for pod, s := range proxies {
		st, err := s.showStat()
		if err != nil {
			t.Fatalf("haproxy stats of %s: %v", pod, err)
		}
		for r, row := range st {
			if v, err := strconv.ParseUint(row["stot"], 10, 64); err == nil {
				out[pod+" "+r] = v
			}
		}
	}
	return out
}

// TestSidecarHAProxy runs the Istio sidecar topology with HAProxy as the
// proxy of both pods. One request crosses three TCP connections:
//
//	leg 1  app (A) -> B:7000, REDIRECTed in A's OUTPUT to 127.0.0.1:15001 (proxy A)
//	leg 2  proxy A (uid 1337, exempt) -> B:7000, REDIRECTed in B's PREROUTING to B:15006 (proxy B)
//	leg 3  proxy B (uid 1337) -> 127.0.0.1:7000 (app B)
//
// Leg 1 and 3 are rewritten, if at all, in the client's own netns, where
// the egress program learns the post-NAT tuple. Leg 2 is rewritten in the
// server's netns after the SYN left the client: the client learns
// A:port -> B:7000, the listener registers A:port -> B:15006.
func TestSidecarHAProxy(t *testing.T) {
	e := newEnv(t, "side", 14)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000")
	proxies := map[string]*sidecar{}
	for _, p := range []*netlab.Pod{a, b} {
		if err := meshlab.InstallCapture(context.Background(), p, meshlab.SidecarCapture()); err != nil {
			t.Fatal(err)
		}
		proxies[p.Name] = e.startSidecar(p)
	}
	c := streamCase{conns: 20, parallel: 20, up: 1 << 20, down: 1 << 20, chunk: 16 << 10}
	addr := hostport(b.IPv4, 7000)

	for _, accel := range []bool{false, true} {
		ok := t.Run(fmt.Sprintf("accel=%v", accel), func(t *testing.T) {
			if accel {
				e.accelerate()
			}
			var before map[string]uint64
			if accel {
				before = e.counters()
			}
			s0 := sessionsOf(t, proxies)
			if out, err := e.run(a, c.args(addr, 500)...); err != nil {
				t.Fatalf("%v\n%s\nproxy a:\n%s\nproxy b:\n%s", err, out, proxies["a"].log, proxies["b"].log)
			}
			s1 := sessionsOf(t, proxies)
			// Every connection went app -> proxy A -> proxy B -> app, and none
			// looped (the proxies' own connections are not captured again).
			n := uint64(c.conns)
			want := map[string]uint64{
				"a outbound/FRONTEND": n, "a original_dst/orig": n, "a inbound/FRONTEND": 0,
				"b inbound/FRONTEND": n, "b local_app/app": n, "b outbound/FRONTEND": 0,
			}
			for r, w := range want {
				if got := s1[r] - s0[r]; got != w {
					t.Errorf("proxy %s: %d sessions, want %d", r, got, w)
				}
			}
			if !accel {
				return
			}
			d := delta(before, e.counters())
			t.Logf("counters: %v", d)
			// Three handshakes per request, each seen by a managed listener.
			if d["handshakes"] != 3*n {
				t.Errorf("handshakes %d, want 3 per request = %d", d["handshakes"], 3*n)
			}
			if d["bytes_redirected"] == 0 {
				t.Errorf("nothing was accelerated: %v", d)
			}
			// Every leg pairs: leg 1 (app -> proxy A, REDIRECT in A's OUTPUT)
			// from the client's egress program; leg 2 (proxy A -> proxy B,
			// REDIRECT in B's PREROUTING) through the alias B's SYN-ACK
			// leaves; leg 3 (proxy B -> app) on loopback, keyed with B's netns.
			if d["fallback_ambiguous"] != 0 {
				t.Errorf("fallback_ambiguous %d: a key collided", d["fallback_ambiguous"])
			}
			if paired := d["pairs"] + d["fallback_early_data"]; paired != 3*n || d["pairs"] == 0 {
				t.Errorf("not every leg paired: pairs %d + early-data %d, want 3 per request = %d; "+
					"fallback_no_local_peer %d, nat_aliases %d",
					d["pairs"], d["fallback_early_data"], 3*n, d["fallback_no_local_peer"], d["nat_aliases"])
			}
		})
		if !ok && !accel {
			t.Fatal("baseline failed")
		}
	}
}
