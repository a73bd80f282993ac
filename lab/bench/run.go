package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// runner owns the lab, its long-running servers and the scratch directory.
type runner struct {
	ctx       context.Context
	o         Options
	lab       *netlab.Lab
	client    *netlab.Pod // a: every client, and the unix floor's server
	tmp       string
	servers   []*server
	stop      context.CancelFunc // kills the servers
	installed bool               // the datapath may be pinned under PinRoot

	echoAddr, streamAddr, unixAddr string
}

type server struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan struct{} // closed once cmd.Wait returned; stderr is complete
}

func newRunner(ctx context.Context, o Options) (_ *runner, err error) {
	r := &runner{ctx: ctx, o: o}
	var sctx context.Context
	sctx, r.stop = context.WithCancel(ctx)
	defer func() {
		if err != nil {
			r.close(datapath.Config{})
		}
	}()
	if r.tmp, err = os.MkdirTemp("", "ezbench-"); err != nil {
		return nil, err
	}
	if r.lab, err = netlab.New(labName, labSubnet); err != nil {
		return nil, err
	}
	if r.client, err = r.lab.AddPod("a", true); err != nil {
		return nil, err
	}
	srv, err := r.lab.AddPod("b", true)
	if err != nil {
		return nil, err
	}
	r.echoAddr = net.JoinHostPort(srv.IPv4.String(), "7001")
	r.streamAddr = net.JoinHostPort(srv.IPv4.String(), "7000")
	r.unixAddr = "unix:" + filepath.Join(r.tmp, "echo.sock")
	r.logf("lab ready: client %s, server %s, CPU %s", r.client.IPv4, srv.IPv4, cpuLabel(o.CPU))
	if err := r.serve(sctx, srv, "tcp", "--stream", ":7000", "--echo", ":7001"); err != nil {
		return nil, err
	}
	if err := r.serve(sctx, r.client, "unix", "--echo", r.unixAddr); err != nil {
		return nil, err
	}
	return r, nil
}

// close stops the servers, removes the lab and, if still pinned, the
// datapath. A zero cfg skips the datapath.
func (r *runner) close(cfg datapath.Config) error {
	var errs []error
	r.stop()
	for _, s := range r.servers {
		<-s.done
	}
	if r.lab != nil {
		errs = append(errs, r.lab.Close())
	}
	if cfg.PinRoot != "" {
		if _, err := os.Stat(cfg.Dir()); err == nil {
			// The lab's processes are gone, so no socket is left to drain.
			errs = append(errs, datapath.Uninstall(cfg, drain))
		}
	}
	if r.tmp != "" {
		errs = append(errs, os.RemoveAll(r.tmp))
	}
	return errors.Join(errs...)
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.o.Log, format+"\n", args...)
}

// cmd prepares `eztunnel args...` in pod p, pinned to the benchmark CPU.
func (r *runner) cmd(ctx context.Context, p *netlab.Pod, args ...string) *exec.Cmd {
	argv := append([]string{r.o.Exe}, args...)
	if r.o.CPU >= 0 {
		argv = append([]string{"taskset", "-c", strconv.Itoa(r.o.CPU)}, argv...)
	}
	return p.Cmd(ctx, argv[0], argv[1:]...)
}

// serve starts `workload serve args...` in p and waits until it listens.
func (r *runner) serve(ctx context.Context, p *netlab.Pod, name string, args ...string) error {
	ready := filepath.Join(r.tmp, "ready-"+name)
	s := &server{done: make(chan struct{})}
	s.cmd = r.cmd(ctx, p, append([]string{"workload", "serve", "--ready-file", ready}, args...)...)
	s.cmd.Stderr = &s.stderr
	if err := p.Start(s.cmd); err != nil {
		return err
	}
	r.servers = append(r.servers, s)
	go func() { s.cmd.Wait(); close(s.done) }()
	deadline := time.After(10 * time.Second)
	for {
		if _, err := os.Stat(ready); err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%s server exited: %s", name, strings.TrimSpace(s.stderr.String()))
		case <-deadline:
			return fmt.Errorf("%s server did not listen within 10s", name)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// run runs `eztunnel args...` in the client pod and returns its stdout.
func (r *runner) run(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(r.ctx, 3*time.Minute)
	defer cancel()
	cmd := r.cmd(ctx, r.client, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := r.client.Run(cmd); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), nil
}

// pingpong measures n round trips of size-byte messages on one fresh
// connection, after n/20 unrecorded ones.
func (r *runner) pingpong(addr string, size, n int) (stats.Summary, error) {
	out, err := r.run("workload", "pingpong", "--addr", addr, "--size", strconv.Itoa(size),
		"--n", strconv.Itoa(n), "--warmup", strconv.Itoa(max(n/20, 10)))
	if err != nil {
		return stats.Summary{}, err
	}
	// Only the summary of `workload pingpong`'s output is needed.
	var res struct {
		RTT stats.Summary `json:"rtt_us"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return stats.Summary{}, fmt.Errorf("pingpong output %q: %w", out, err)
	}
	return res.RTT, nil
}

// transfer sends n bytes client -> server on one fresh connection and
// returns the seconds from connect until the server confirmed the last byte,
// as the client measured them. Bytes are not generated or checked here
// (the e2e tests prove byte-exactness): that work would dominate the time.
func (r *runner) transfer(n uint64) (float64, error) {
	out, err := r.run("workload", "stream", "--addr", r.streamAddr, "--conns", "1", "--no-check",
		"--up", strconv.FormatUint(n, 10), "--down", "0", "--chunk", "262144")
	if err != nil {
		return 0, err
	}
	var res struct {
		Seconds float64 `json:"seconds"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return 0, fmt.Errorf("stream output %q: %w", out, err)
	}
	return res.Seconds, nil
}

func cpuLabel(cpu int) string {
	if cpu < 0 {
		return "unpinned"
	}
	return strconv.Itoa(cpu)
}
