package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// env is one test's node: a lab and, once accelerate is called, a datapath
// attached to the lab's managed cgroup subtree, pinned in a path of its own.
type env struct {
	t   *testing.T
	lab *netlab.Lab
	cfg datapath.Config
	dp  *datapath.Datapath
}

func newEnv(t *testing.T, name string, subnet int) *env {
	t.Helper()
	lab, err := netlab.New(name, subnet)
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("lab cleanup: %v", err)
		}
	})
	cfg := datapath.DefaultConfig()
	e := &env{t: t, lab: lab, cfg: cfg}
	e.cfg.PinRoot = e.pin("/sys/fs/bpf/eztest-" + name)
	return e
}

// pin records a bpffs path the test may pin under, so a killed run's pins
// are swept, and returns it.
func (e *env) pin(path string) string {
	e.t.Helper()
	if _, err := e.lab.Record(netlab.RecPin, path); err != nil {
		e.t.Fatal(err)
	}
	return path
}

func (e *env) pod(name string, managed bool) *netlab.Pod {
	e.t.Helper()
	p, err := e.lab.AddPod(name, managed)
	if err != nil {
		e.t.Fatalf("pod %s: %v", name, err)
	}
	return p
}

// accelerate installs the datapath on the lab's managed subtree.
func (e *env) accelerate() {
	e.t.Helper()
	if err := rlimit.RemoveMemlock(); err != nil {
		e.t.Fatal(err)
	}
	dp, err := datapath.Install(e.cfg, []string{e.lab.Managed})
	if err != nil {
		e.t.Fatalf("install datapath: %v", err)
	}
	e.dp = dp
	e.t.Cleanup(func() {
		dp.Close()
		if err := datapath.Uninstall(e.cfg, 10*time.Second); err != nil {
			e.t.Errorf("uninstall: %v", err)
		}
	})
}

func (e *env) counters() datapath.Counters {
	e.t.Helper()
	c, err := e.dp.Counters()
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// delta returns after - before for every counter.
func delta(before, after datapath.Counters) datapath.Counters {
	d := datapath.Counters{}
	for k, v := range after {
		d[k] = v - before[k]
	}
	return d
}

// serve starts `eztunnel workload serve args...` in pod and waits until it listens.
func (e *env) serve(p *netlab.Pod, args ...string) {
	e.t.Helper()
	srv, err := workload.Client{Exe: labBin}.Serve(context.Background(), p, e.t.TempDir(), args...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(srv.Stop)
}

// startIn starts any command in a pod; it is killed at cleanup.
func (e *env) startIn(p *netlab.Pod, name string, args ...string) *exec.Cmd {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := p.Cmd(ctx, name, args...)
	if err := p.Start(cmd); err != nil {
		cancel()
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cancel(); cmd.Wait() })
	return cmd
}

// run runs `eztunnel-lab args...` in pod and returns stdout; stderr goes into the error.
func (e *env) run(p *netlab.Pod, args ...string) (string, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := p.Cmd(ctx, labBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := p.Run(cmd); err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

func waitFile(t *testing.T, path string, diag func() string) {
	t.Helper()
	deadline := time.Now().Add(scaled(10 * time.Second))
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s did not appear: %s", path, diag())
}

// timeScale stretches the tests' waiting deadlines (never a measured time):
// EZTUNNEL_E2E_TIME_SCALE=30 for a kernel under qemu without KVM (TCG runs
// about 30 times slower), as scripts/kernels sets it.
var timeScale = func() time.Duration {
	n, err := strconv.Atoi(os.Getenv("EZTUNNEL_E2E_TIME_SCALE"))
	if err != nil || n < 1 {
		return 1
	}
	return time.Duration(n)
}()

func scaled(d time.Duration) time.Duration { return d * timeScale }

// fullCounts (EZTUNNEL_E2E_FULL=1, make test-kernels-programs) keeps the
// issue's counts under TCG too: the tests that run fewer exchanges there
// to fit CI's time run all of them, and must.
var fullCounts = os.Getenv("EZTUNNEL_E2E_FULL") == "1"
