package e2e

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/kernelinfo"
	"github.com/eztunnel/eztunnel/internal/nodelayout"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
)

// preflightJSON is `eztunnel preflight -o json`.
type preflightJSON struct {
	Kernel       string         `json:"kernel"`
	Capabilities []string       `json:"capabilities"`
	Parts        []parts.Status `json:"parts"`
	CoreRuns     bool           `json:"core_runs"`
}

func runPreflight(t *testing.T, env ...string) (preflightJSON, string, error) {
	t.Helper()
	cmd := sysexec.Command(context.Background(), bin, "preflight", "-o", "json")
	cmd.Env = append(os.Environ(), env...)
	var out, errOut logbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var rep preflightJSON
	if jerr := json.Unmarshal([]byte(out.String()), &rep); jerr != nil {
		t.Fatalf("preflight -o json: %v\n%s\n%s", jerr, out.String(), errOut.String())
	}
	return rep, errOut.String(), err
}

func partOf(t *testing.T, list []parts.Status, p parts.Name) parts.Status {
	t.Helper()
	for _, s := range list {
		if s.Part == p {
			return s
		}
	}
	t.Fatalf("part %s not reported: %+v", p, list)
	return parts.Status{}
}

// TestParts: preflight reports every part of this kernel, each part that
// cannot run with a reason; a part whose program the kernel refuses turns
// off alone (the rest runs, byte-exact) and says so in the log, `status`
// and the metric; a refused required program stops the agent before
// anything is pinned. The refusals come from bpfsys.TestRefuseEnv, so the
// degraded paths are proven on kernels that would load everything.
func TestParts(t *testing.T) {
	var base preflightJSON // this kernel, nothing refused
	t.Run("preflight", func(t *testing.T) {
		rep, _, err := runPreflight(t)
		base = rep
		if err != nil || !rep.CoreRuns {
			t.Fatalf("preflight on the test kernel: %v, core_runs %v: %+v", err, rep.CoreRuns, rep)
		}
		if rep.Kernel != kernelinfo.Release() || !slices.Contains(rep.Capabilities, "CAP_BPF") {
			t.Errorf("preflight kernel %q capabilities %v, want %q and CAP_BPF", rep.Kernel, rep.Capabilities, kernelinfo.Release())
		}
		if len(rep.Parts) != len(parts.All) {
			t.Errorf("preflight reports %d parts, want %d: %+v", len(rep.Parts), len(parts.All), rep.Parts)
		}
		for _, s := range rep.Parts {
			if s.Runs == (s.Reason != "") {
				t.Errorf("part %s: runs %v with reason %q", s.Part, s.Runs, s.Reason)
			}
		}
		for _, p := range []parts.Name{parts.Shortcut, parts.ReadAccounting, parts.Release} {
			if !partOf(t, rep.Parts, p).Runs {
				t.Errorf("part %s does not run although the core does: %+v", p, rep.Parts)
			}
		}
	})

	t.Run("required_refused", func(t *testing.T) {
		refuse := bpfsys.TestRefuseEnv + "=ez_sc_release_switched"
		rep, stderr, err := runPreflight(t, refuse)
		if err == nil || rep.CoreRuns {
			t.Fatalf("preflight with ez_sc_release_switched refused: exit %v, core_runs %v", err, rep.CoreRuns)
		}
		if s := partOf(t, rep.Parts, parts.Shortcut); s.Runs || !strings.Contains(s.Reason, "ez_sc_release_switched") || !strings.Contains(s.Reason, string(parts.Release)) {
			t.Errorf("shortcut with ez_sc_release_switched refused: %+v", s)
		}
		if !strings.Contains(stderr, "ez_sc_release_switched") {
			t.Errorf("preflight error does not name ez_sc_release_switched: %s", stderr)
		}
		e := newEnv(t, "prq", 43)
		pin := e.pin("/sys/fs/bpf/eztest-parts-required")
		cmd := sysexec.Command(context.Background(), bin, "run", "--cgroup", e.lab.Managed, "--pin-path", pin)
		cmd.Env = append(os.Environ(), refuse)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "program ez_sc_release_switched (release)") {
			t.Errorf("run with ez_sc_release_switched refused: %v, want an error naming it and its part:\n%s", err, out)
		}
		assertRemoved(t, e.lab.Managed, pin)
	})

	t.Run("optional_refused", func(t *testing.T) {
		e := newEnv(t, "pop", 44)
		a, b := e.pod("a", true), e.pod("b", true)
		e.serve(b, "--stream", ":7000")
		pin := e.pin("/sys/fs/bpf/eztest-parts-optional")
		t.Cleanup(func() { eztunnel(context.Background(), "uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
		metricsAddr := freeAddr(t)
		ready := filepath.Join(t.TempDir(), "ready")
		refused := map[parts.Name]string{parts.ShortcutNAT: "ez_sc_nat", parts.CloseReset: "ez_sc_close_reset", parts.Adoption: "ez_sc_adopt_step"}
		names := []string{"ez_sc_nat_ct", "ez_sc_nat_tc", "ez_sc_nat_dev"} // shortcut-nat's other learners, refused too
		for _, n := range refused {
			names = append(names, n)
		}
		agent := sysexec.Command(context.Background(), bin, "run", "--cgroup", e.lab.Managed, "--pin-path", pin,
			"--metrics-addr", metricsAddr, "--ready-file", ready)
		agent.Env = append(os.Environ(), bpfsys.TestRefuseEnv+"="+strings.Join(names, ","))
		logs := &logbuf.Buffer{}
		agent.Stdout, agent.Stderr = logs, logs
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { agent.Process.Kill(); agent.Wait() }()
		waitFile(t, ready, logs.String)

		out, err := eztunnel(context.Background(), "status", "-o", "json", "--pin-path", pin)
		if err != nil {
			t.Fatalf("status: %v\n%s", err, out)
		}
		var st struct {
			Links []struct {
				Pin string `json:"pin"`
			} `json:"links"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status json: %v\n%s", err, out)
		}
		st2 := statusParts(t, pin)
		for deadline := time.Now().Add(scaled(10 * time.Second)); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if c, err := net.Dial("tcp", metricsAddr); err == nil {
				c.Close()
				break
			}
		}
		if agent.ProcessState != nil || agent.Process.Signal(syscall.Signal(0)) != nil {
			t.Fatalf("agent exited:\n%s", logs.String())
		}
		m := scrape(t, metricsAddr)
		for p, prog := range refused {
			s := partOf(t, st2.Parts, p)
			if b := partOf(t, base.Parts, p); !b.Runs {
				// This kernel lacks the part anyway: off, with its own reason.
				if s.Runs || s.Reason == "" {
					t.Errorf("status: part %s: %+v, want off (preflight: %q)", p, s, b.Reason)
				}
			} else if s.Runs || !strings.Contains(s.Reason, "program "+prog+" ("+string(p)+")") || !strings.Contains(s.Reason, bpfsys.ErrTestRefused.Error()) ||
				s.Code != parts.CodeRefusedForTest {
				t.Errorf("status: part %s: %+v, want off naming %s", p, s, prog)
			}
			if !strings.Contains(logs.String(), "part="+string(p)) {
				t.Errorf("the agent's log does not name the part %s:\n%s", p, logs.String())
			}
			key := `eztunnel_feature_enabled{feature="` + string(p) + `",reason="` + s.Label() + `"}`
			if v, ok := m[key]; !ok || v != 0 {
				t.Errorf("metric %s = %v (present %v)", key, v, ok)
			}
		}
		if v := m[`eztunnel_feature_enabled{feature="shortcut",reason=""}`]; v != 1 {
			t.Errorf("eztunnel_feature_enabled for the shortcut = %v, want 1", v)
		}
		for _, l := range st.Links {
			// ez_close_reset: a legacy tc filter's record keeps the old name.
			if strings.Contains(l.Pin, "ez_sc_nat") || strings.Contains(l.Pin, "ez_sc_close_reset") || strings.Contains(l.Pin, "ez_close_reset") || strings.Contains(l.Pin, "ez_sc_sock_release") {
				t.Errorf("a link of a part that is off is pinned: %s", l.Pin)
			}
		}
		// The shortcut itself runs: byte-exact, paired.
		before := pinnedCounters(t, pin)
		if out, err := e.run(a, streamCase{conns: 10, parallel: 10, up: 1 << 20, down: 1 << 20, chunk: 65536}.args(hostport(b.IPv4, 7000), 3)...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		requirePaired(t, delta(before, pinnedCounters(t, pin)), 10, 1, "with NAT, RST on close and adoption off")

		agent.Process.Signal(syscall.SIGTERM)
		agent.Wait()
		if out, err := eztunnel(context.Background(), "uninstall", "--pin-path", pin); err != nil {
			t.Fatalf("uninstall: %v\n%s", err, out)
		}
		assertRemoved(t, e.lab.Managed, pin)
		if _, err := os.Stat(nodelayout.Layout{PinRoot: pin}.Report()); !os.IsNotExist(err) {
			t.Errorf("uninstall left the parts report: %v", err)
		}
	})
}

// statusParts is the parts report `eztunnel status` shows for the datapath
// pinned under pin (the running agent's).
func statusParts(t *testing.T, pin string) *parts.Report {
	t.Helper()
	out, err := eztunnel(context.Background(), "status", "-o", "json", "--pin-path", pin)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var st struct {
		Parts *parts.Report `json:"parts"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Parts == nil {
		t.Fatalf("status json (parts): %v\n%s", err, out)
	}
	return st.Parts
}
