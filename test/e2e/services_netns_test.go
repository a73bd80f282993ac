package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// TestServicesNetNSUnreachable: the Service LB destroys the sockets of a
// removed backend from inside each managed pod's network namespace. An
// agent that cannot enter one (here: without CAP_SYS_ADMIN, as the chart's
// default capabilities were; in a pod without hostPID the processes are not
// even visible) counts it in eztunnel_services_netns_unreachable and is not
// ready, naming why; with what it needs it is ready and counts none.
func TestServicesNetNSUnreachable(t *testing.T) {
	e := newEnv(t, "svcns", 89)
	c, b := e.pod("c", true), e.pod("b", false)
	for _, p := range []*netlab.Pod{c, b} {
		a := svcPy("server", "8080", p.Name)
		e.startIn(p, a[0], a[1:]...)
		waitListen(t, p, 8080)
	}
	pin := e.cfg.PinRoot
	t.Cleanup(func() { eztunnel(context.Background(), "uninstall", "--pin-path", pin, "--drain-timeout", "1s") })
	svcFile := filepath.Join(t.TempDir(), "services.yaml")
	writeServices(t, svcFile, fmt.Sprintf("services:\n- {name: web, ip: 10.96.89.10, port: 80, backends: [%q]}\n", hostport(b.IPv4, 8080)))

	run := func(t *testing.T, wrap ...string) (ready string, unreachable float64) {
		t.Helper()
		metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
		readyFile := filepath.Join(t.TempDir(), "ready")
		args := append(wrap, bin, "run", "--cgroup", e.lab.Managed, "--pin-path", pin, "--adopt=false",
			"--services", "--services-file", svcFile, "--metrics-addr", metricsAddr, "--health-addr", healthAddr, "--ready-file", readyFile)
		agent := sysexec.Command(context.Background(), args[0], args[1:]...)
		logs := &logbuf.Buffer{}
		agent.Stdout, agent.Stderr = logs, logs
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			agent.Process.Signal(syscall.SIGTERM)
			agent.Wait()
			if t.Failed() {
				t.Logf("agent log:\n%s", logs.String())
			}
		}()
		waitFile(t, readyFile, logs.String)
		resp, err := http.Get("http://" + healthAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := scrape(t, metricsAddr)
		v, ok := m["eztunnel_services_netns_unreachable"]
		if !ok {
			t.Errorf("eztunnel_services_netns_unreachable missing")
		}
		return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body))), v
	}

	t.Run("without-CAP_SYS_ADMIN", func(t *testing.T) {
		ready, n := run(t, "setpriv", "--bounding-set", "-sys_admin", "--")
		t.Logf("readyz: %s; eztunnel_services_netns_unreachable %v", ready, n)
		if n < 1 {
			t.Errorf("eztunnel_services_netns_unreachable = %v, want pod c's namespace counted", n)
		}
		if !strings.HasPrefix(ready, "503 ") || !strings.Contains(ready, "cannot be entered") {
			t.Errorf("readyz %q, want 503 naming the namespaces it cannot enter", ready)
		}
	})
	t.Run("with-CAP_SYS_ADMIN", func(t *testing.T) {
		ready, n := run(t)
		t.Logf("readyz: %s; eztunnel_services_netns_unreachable %v", ready, n)
		if n != 0 || !strings.HasPrefix(ready, "200 ") {
			t.Errorf("readyz %q, unreachable %v; want ready and none", ready, n)
		}
	})
}
