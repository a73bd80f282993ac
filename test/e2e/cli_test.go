package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// attachedPrograms counts the programs attached to a cgroup for the hooks eztunnel uses.
func attachedPrograms(t *testing.T, cgroup string) int {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupSockOps, ebpf.AttachCGroupInetEgress} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %s: %v", cgroup, err)
		}
		n += len(res.Programs)
	}
	return n
}

func eztunnel(ctx context.Context, args ...string) (string, error) {
	cmd := sysexec.Command(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestAgentLifecycle: `run` attaches and serves, `status -o json` reports the
// counters (also after the agent stopped: the datapath is pinned), and
// `uninstall` leaves neither programs on the cgroup nor pins.
func TestAgentLifecycle(t *testing.T) {
	e := newEnv(t, "cli", 19)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000")
	pin := e.pin("/sys/fs/bpf/eztest-cli-agent")
	t.Cleanup(func() { eztunnel(context.Background(), "uninstall", "--pin-path", pin, "--drain-timeout", "1s") })

	ready := filepath.Join(t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agent := sysexec.Command(ctx, bin, "run", "--cgroup", e.lab.Managed, "--pin-path", pin, "--ready-file", ready)
	logs := &logbuf.Buffer{}
	agent.Stdout, agent.Stderr = logs, logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	waitFile(t, ready, logs.String)
	if n := attachedPrograms(t, e.lab.Managed); n != 2 {
		t.Errorf("%d programs on the managed cgroup, want 2", n)
	}

	if out, err := e.run(a, streamCase{conns: 10, parallel: 10, up: 1 << 20, down: 1 << 20, chunk: 65536, handshake: true}.args(hostport(b.IPv4, 7000), 3)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	status := func() map[string]uint64 {
		out, err := eztunnel(ctx, "status", "-o", "json", "--pin-path", pin)
		if err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		var rep struct {
			Counters map[string]uint64 `json:"counters"`
			Links    []struct {
				Pin     string `json:"pin"`
				Program uint32 `json:"program_id"`
			} `json:"links"`
			Parts *parts.Report `json:"parts"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("status json: %v\n%s", err, out)
		}
		if rep.Parts == nil {
			t.Fatalf("status: no parts report\n%s", out)
		}
		// ez_sc_egress and ez_sc_sockops on the managed cgroup; where the kernel
		// has the part (docs/kernels.md): ez_sc_sock_release there too,
		// the NAT learner (ez_sc_nat_ct, or ez_sc_nat for IPv4 and IPv6, or
		// ez_sc_nat_dev), ez_sc_recv_fx or ez_sc_recv; ez_sc_close_reset on lo
		// (egress) and on both ways of each pod veth (a, b and whatever
		// else this namespace has).
		var pins, tcx []string
		for _, l := range rep.Links {
			if l.Program == 0 {
				t.Errorf("status: link %s without a program", l.Pin)
			}
			if strings.HasPrefix(l.Pin, "bypass/") || strings.HasPrefix(l.Pin, "services/") {
				continue // the other families' directories
			}
			if strings.HasPrefix(l.Pin, "links/tcx/") || strings.HasPrefix(l.Pin, bpfsys.TCDir+"/") {
				tcx = append(tcx, l.Pin)
				continue
			}
			pins = append(pins, l.Pin)
		}
		want := []string{"ez_sc_egress", "ez_sc_sockops"}
		if rep.Parts.Runs(parts.CloseReset) {
			want = append(want, "ez_sc_sock_release")
		}
		if st, _ := rep.Parts.Get(parts.ShortcutNAT); st.Runs {
			_, nat := natLearner(t, st, "")
			for _, p := range nat {
				want = append(want, strings.TrimPrefix(p, "/"))
			}
		}
		switch st, _ := rep.Parts.Get(parts.ReadAccounting); {
		case strings.HasPrefix(st.Via, "fexit/"):
			want = append(want, "links/tracing/ez_sc_recv_fx")
		case strings.HasPrefix(st.Via, "tp_btf/"):
			want = append(want, "links/tracing/ez_sc_recv")
		}
		switch st, _ := rep.Parts.Get(parts.SpliceGuard); {
		case !st.Runs:
		case strings.HasPrefix(st.Via, "fentry/"):
			want = append(want, "links/tracing/ez_sc_splice_fe")
		case strings.HasPrefix(st.Via, "tracepoints "):
			want = append(want, "links/tracing/ez_sc_splice_tp", "links/tracing/ez_sc_sendfile_tp")
		default:
			want = append(want, "links/tracing/ez_sc_splice")
		}
		for _, w := range want {
			if !slices.ContainsFunc(pins, func(p string) bool { return strings.HasSuffix(p, w) }) {
				t.Errorf("status: pinned links %v, want %s (parts %+v)", pins, w, rep.Parts.Parts)
			}
		}
		if len(pins) != len(want) {
			t.Errorf("status: pinned links %v, want %v", pins, want)
		}
		if !rep.Parts.Runs(parts.CloseReset) {
			if len(tcx) != 0 {
				t.Errorf("status: close-reset is off (%+v) but device links are pinned: %v", rep.Parts.Parts, tcx)
			}
		} else if len(tcx) < 5 || !slices.ContainsFunc(tcx, func(p string) bool {
			return strings.HasSuffix(p, "/1/ez_sc_close_reset_egress") || strings.HasSuffix(p, "/1/ez_close_reset_egress") /* legacy tc */
		}) {
			t.Errorf("status: pinned device links %v, want lo's egress and both ways of a's and b's veths", tcx)
		}
		return rep.Counters
	}
	c0 := status()
	requirePaired(t, c0, 10, 1, "status after 10 connections")
	// A direction redirects only once its receiver has read every byte the
	// kernel path brought (bpf/shortcut/splice.h). The streams open with a
	// request/response (--handshake): each side has read all its peer sent
	// before its stream starts, so both directions of every paired
	// connection open at their first stream byte, whatever the timing, and
	// all 2 MiB of each go through the shortcut. (Pipelined streams open
	// only when their reader catches up, which under TCG some never do.)
	t.Logf("rx_opened %d bytes_redirected %d pairs %d", c0["rx_opened"], c0["bytes_redirected"], c0["pairs"])
	if c0["rx_opened"] < 2*c0["pairs"] || c0["bytes_redirected"] < c0["pairs"]*(2<<20) {
		t.Errorf("status: %d directions opened, %d bytes redirected for %d paired connections of 1 MiB each way, want both directions of each open and 2 MiB each: %v", c0["rx_opened"], c0["bytes_redirected"], c0["pairs"], c0)
	}

	agent.Process.Signal(syscall.SIGTERM)
	if err := agent.Wait(); err != nil {
		t.Fatalf("agent exit: %v\n%s", err, logs.String())
	}
	if c := status(); c["pairs"] != c0["pairs"] {
		t.Errorf("status with the agent stopped: %v, was %v", c, c0)
	}
	if n := attachedPrograms(t, e.lab.Managed); n != 2 {
		t.Errorf("stopping the agent detached programs: %d left, want 2", n)
	}
	if out, err := eztunnel(ctx, "uninstall", "--pin-path", pin); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	assertRemoved(t, e.lab.Managed, pin)
}

// assertRemoved checks that nothing of eztunnel is left on the cgroup or
// under the pin path.
func assertRemoved(t *testing.T, cgroup, pin string) {
	t.Helper()
	if n := attachedPrograms(t, cgroup); n != 0 {
		t.Errorf("%d programs left on the cgroup %s", n, cgroup)
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Errorf("pins left in %s: %v", pin, err)
	}
}

// TestBadInput: each invalid invocation fails with a message naming the
// problem and leaves no program attached and nothing pinned.
func TestBadInput(t *testing.T) {
	e := newEnv(t, "bad", 20)
	pin := e.pin("/sys/fs/bpf/eztest-bad")
	v1 := firstCgroupV1(t, e)
	badSvc := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(badSvc, []byte("services:\n- {name: web, vip: 10.96.0.1, port: 80}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		args    []string
		wrap    func(*exec.Cmd)
		message string
	}{
		{"missing cgroup", []string{"--cgroup", "/sys/fs/cgroup/unified/no-such-cgroup"}, nil, "no-such-cgroup"},
		{"cgroup v1", []string{"--cgroup", v1}, nil, "cgroup v1"},
		{"not a cgroup", []string{"--cgroup", "/tmp"}, nil, "not in a cgroup v2"},
		{"bad map size", []string{"--cgroup", e.lab.Managed, "--max-sockets", "0"}, nil, "max sockets"},
		{"bad max unread", []string{"--cgroup", e.lab.Managed, "--max-unread", "100"}, nil, "max unread (--max-unread) 100 bytes out of range"},
		{"relative pin path", []string{"--cgroup", e.lab.Managed, "--pin-path", "bpf/x"}, nil, "absolute"},
		{"unknown flag", []string{"--cgroup", e.lab.Managed, "--frobnicate"}, nil, "frobnicate"},
		{"negative adopt interval", []string{"--cgroup", e.lab.Managed, "--adopt-interval", "-1s"}, nil, "--adopt-interval -1s must not be negative"},
		{"services file without --services", []string{"--cgroup", e.lab.Managed, "--services-file", badSvc}, nil, "--services-file needs --services"},
		{"missing services file", []string{"--cgroup", e.lab.Managed, "--services", "--services-file", "/nonexistent/services.yaml"}, nil, "/nonexistent/services.yaml"},
		{"bad services file", []string{"--cgroup", e.lab.Managed, "--services", "--services-file", badSvc}, nil, "field vip not found"},
		{"services file and kubeconfig", []string{"--cgroup", e.lab.Managed, "--services", "--services-file", badSvc, "--kubeconfig", "/x"}, nil, "exclude each other"},
		{"health checks without --nodeport", []string{"--cgroup", e.lab.Managed, "--services", "--kubeconfig", "/x", "--nodeport-healthcheck-addresses", "127.0.0.1"}, nil, "--nodeport-healthcheck-addresses needs --nodeport"},
		// The name before the --nodeport-* scheme still works.
		{"health check address not an IP", []string{"--cgroup", e.lab.Managed, "--services", "--nodeport", "--kubeconfig", "/x", "--healthcheck-addresses", "node1"}, nil, `"node1" is not an IP address`},
		{"drain timeout without --kubernetes", []string{"--cgroup", e.lab.Managed, "--drain-timeout", "5s"}, nil, "--drain-timeout needs --kubernetes"},
		{"the old drain timeout's name", []string{"--cgroup", e.lab.Managed, "--removal-drain-timeout", "5s"}, nil, "--removal-drain-timeout needs --kubernetes"},
		{"services kubeconfig missing", []string{"--cgroup", e.lab.Managed, "--services", "--kubeconfig", "/nonexistent/kubeconfig"}, nil, "/nonexistent/kubeconfig"},
		{"not root", []string{"--cgroup", e.lab.Managed}, func(c *exec.Cmd) {
			c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}, "not running as root"},
		// A kernel without BTF: hide /sys/kernel/btf in a private mount namespace.
		{"no kernel BTF", nil, nil, "kernel BTF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			args := append([]string{"run", "--pin-path", pin}, tc.args...)
			var cmd *exec.Cmd
			if tc.args == nil {
				script := `mount -t tmpfs none /sys/kernel/btf && exec "$0" "$@"`
				cmd = sysexec.Command(ctx, "unshare", "-m", "--propagation", "private", "sh", "-c", script, bin, "run", "--pin-path", pin, "--cgroup", e.lab.Managed)
				for _, p := range []string{"sh", "mount"} { // run by unshare
					if err := sysexec.Check(p); err != nil {
						t.Fatal(err)
					}
				}
			} else {
				cmd = sysexec.Command(ctx, bin, args...)
			}
			if tc.wrap != nil {
				tc.wrap(cmd)
			}
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("succeeded, want an error naming %q:\n%s", tc.message, out)
			}
			if !strings.Contains(string(out), tc.message) {
				t.Errorf("error does not name %q:\n%s", tc.message, out)
			}
			if n := attachedPrograms(t, e.lab.Managed) + lbPrograms(t, e.lab.Managed); n != 0 {
				t.Errorf("%d programs left attached", n)
			}
			if _, err := os.Stat(filepath.Join(pin, datapath.Schema)); !os.IsNotExist(err) {
				t.Errorf("pins left behind in %s", pin)
			}
		})
	}
	os.Remove(pin)
}

// firstCgroupV1 returns a mounted cgroup v1 hierarchy; without one it
// mounts a named hierarchy (unmounted at cleanup) and fails if it cannot.
func firstCgroupV1(t *testing.T, e *env) string {
	t.Helper()
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "cgroup" {
			return f[1]
		}
	}
	// Without one, make one: a named v1 hierarchy needs no controller.
	dir := t.TempDir()
	if _, err := e.lab.Record(netlab.RecMount, dir); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("cgroup", dir, "cgroup", 0, "none,name=eztest"); err != nil {
		t.Fatalf("no cgroup v1 hierarchy mounted and mounting one failed: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	return dir
}

// TestInstallRollsBack: when attaching to the second cgroup fails after the
// first succeeded, the first is detached again and nothing stays pinned.
func TestInstallRollsBack(t *testing.T) {
	e := newEnv(t, "roll", 21)
	cfg := e.cfg
	gone := filepath.Join(e.lab.Managed, "gone")
	if err := os.Mkdir(gone, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(gone) // valid path a moment ago, gone now
	_, err := datapath.Install(cfg, []string{e.lab.Managed, gone})
	if err == nil {
		datapath.Uninstall(cfg, time.Second)
		t.Fatal("install onto a missing cgroup succeeded")
	}
	if !strings.Contains(err.Error(), "gone") {
		t.Errorf("error does not name the cgroup: %v", err)
	}
	if n := attachedPrograms(t, e.lab.Managed); n != 0 {
		t.Errorf("%d programs left on the first cgroup", n)
	}
	if _, err := os.Stat(cfg.PinRoot); !os.IsNotExist(err) {
		t.Errorf("pins left behind in %s", cfg.PinRoot)
	}
}

func eztunnelOut(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), scaled(30*time.Second))
	defer cancel()
	return eztunnel(ctx, args...)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
