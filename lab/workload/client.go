package workload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Pod is where the lab runs a command; *netlab.Pod satisfies it.
type Pod interface {
	Cmd(ctx context.Context, name string, args ...string) *exec.Cmd
	Start(cmd *exec.Cmd) error
}

// Client starts the lab binary's workload commands (and other tools) in
// pods, every process placed as Placement says.
type Client struct {
	Exe string // the eztunnel-lab binary
	Placement
}

// Placement is the CPU affinity and nice value a process starts with.
type Placement struct {
	CPUs []int // CPU affinity; empty: any CPU
	Nice int   // scheduling niceness (-20..19); 0: unchanged
}

// Usage is what running one client process cost.
type Usage struct {
	Seconds float64 // wall time
	CPU     float64 // the process's own user+system seconds (rusage)
}

// Start starts cmd in p, placed from its first instruction.
func (c Client) Start(p Pod, cmd *exec.Cmd) error {
	return c.Placement.Start(func() error { return p.Start(cmd) })
}

// Start calls start (which forks) on a thread with the placement's CPU
// affinity and niceness, which the child inherits, then restores the
// thread's own. A zero Placement starts as is.
func (pl Placement) Start(start func() error) error {
	if len(pl.CPUs) == 0 && pl.Nice == 0 {
		return start()
	}
	runtime.LockOSThread()
	var oldSet unix.CPUSet
	oldNice, err := unix.Getpriority(unix.PRIO_PROCESS, 0) // this thread: 20 - nice
	if err == nil {
		err = unix.SchedGetaffinity(0, &oldSet)
	}
	if err == nil && len(pl.CPUs) > 0 {
		var set unix.CPUSet
		for _, c := range pl.CPUs {
			set.Set(c)
		}
		if err = unix.SchedSetaffinity(0, &set); err != nil {
			err = fmt.Errorf("sched_setaffinity %v: %w", pl.CPUs, err)
		}
	}
	if err == nil && pl.Nice != 0 {
		if err = unix.Setpriority(unix.PRIO_PROCESS, 0, pl.Nice); err != nil {
			err = fmt.Errorf("setpriority %d: %w", pl.Nice, err)
		}
	}
	if err == nil {
		err = start()
	}
	// A thread that cannot be restored stays locked to this goroutine and
	// exits with it: no other goroutine runs with its placement.
	if unix.SchedSetaffinity(0, &oldSet) == nil && unix.Setpriority(unix.PRIO_PROCESS, 0, 20-oldNice) == nil {
		runtime.UnlockOSThread()
	}
	return err
}

// ParseCPUs reads a CPU list like "0", "0-1" or "0,2"; "" is none.
func ParseCPUs(s string) ([]int, error) {
	var cpus []int
	if s == "" {
		return nil, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if isRange && err == nil {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b >= runtime.NumCPU() {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU or range of the %d CPUs here", s, part, runtime.NumCPU())
		}
		for i := a; i <= b; i++ {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// Run runs argv in p and returns its stdout; an error carries its stderr.
func (c Client) Run(ctx context.Context, p Pod, timeout time.Duration, argv ...string) ([]byte, Usage, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := p.Cmd(ctx, argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := c.Start(p, cmd)
	if err == nil {
		err = cmd.Wait()
	}
	u := Usage{Seconds: time.Since(start).Seconds()}
	if cmd.ProcessState != nil {
		u.CPU = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	if err != nil {
		return out.Bytes(), u, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(errb.String()+" "+out.String()))
	}
	return out.Bytes(), u, nil
}

// Workload runs `eztunnel-lab workload args...` in p and decodes its JSON
// output into out.
func (c Client) Workload(ctx context.Context, p Pod, timeout time.Duration, out any, args ...string) (Usage, error) {
	b, u, err := c.Run(ctx, p, timeout, append([]string{c.Exe, "workload"}, args...)...)
	if err != nil {
		return u, err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return u, fmt.Errorf("workload %s output %q: %w", args[0], b, err)
	}
	return u, nil
}

// PingPongArgs are the flags of `workload pingpong`.
type PingPongArgs struct {
	Addr     string
	Size     int
	N        int // recorded round trips
	Warmup   int
	Interval time.Duration // 0: back to back
	Raw      bool          // return every sample
	Conns    int           // connections (default 1), one after the other
}

// PingPong runs one ping-pong client in p.
func (c Client) PingPong(ctx context.Context, p Pod, pp PingPongArgs) (PingPongResult, Usage, error) {
	args := []string{"pingpong", "--addr", pp.Addr, "--size", strconv.Itoa(pp.Size),
		"--n", strconv.Itoa(pp.N), "--warmup", strconv.Itoa(pp.Warmup)}
	if pp.Interval > 0 {
		args = append(args, "--interval", pp.Interval.String())
	}
	if pp.Raw {
		args = append(args, "--raw")
	}
	conns := max(pp.Conns, 1)
	if conns > 1 {
		args = append(args, "--conns", strconv.Itoa(conns), "--sequential")
	}
	timeout := 3*time.Minute + time.Duration(conns*(pp.N+pp.Warmup))*pp.Interval
	var res PingPongResult
	u, err := c.Workload(ctx, p, timeout, &res, args...)
	if err == nil && pp.Raw && len(res.Samples) != conns*pp.N {
		err = fmt.Errorf("pingpong: %d samples, want %d", len(res.Samples), conns*pp.N)
	}
	return res, u, err
}

// Upload sends n bytes client -> server over one fresh connection,
// unchecked (`workload stream --no-check`), and returns the seconds from
// connect until the server confirmed the last byte.
func (c Client) Upload(ctx context.Context, p Pod, addr string, n uint64, chunk int) (float64, Usage, error) {
	var res StreamReport
	u, err := c.Workload(ctx, p, 5*time.Minute, &res, "stream", "--addr", addr, "--conns", "1", "--no-check",
		"--up", strconv.FormatUint(n, 10), "--down", "0", "--chunk", strconv.Itoa(chunk))
	if err == nil && res.Seconds <= 0 {
		err = fmt.Errorf("stream: %v seconds", res.Seconds)
	}
	return res.Seconds, u, err
}

// Server is a running `workload serve` (or any process started by Serve).
type Server struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{} // closed once cmd.Wait returned
}

func (s *Server) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.Write(b)
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop kills the server and waits for it.
func (s *Server) Stop() {
	s.cancel()
	<-s.done
}

// Serve starts `workload serve args...` in p and waits until it wrote its
// ready file (in dir) or failed. The server runs until Stop or ctx ends.
func (c Client) Serve(ctx context.Context, p Pod, dir string, args ...string) (*Server, error) {
	f, err := os.CreateTemp(dir, "ready-")
	if err != nil {
		return nil, err
	}
	ready := f.Name()
	f.Close()
	os.Remove(ready)
	defer os.Remove(ready)
	s := &Server{done: make(chan struct{})}
	var sctx context.Context
	sctx, s.cancel = context.WithCancel(ctx)
	s.cmd = p.Cmd(sctx, c.Exe, append([]string{"workload", "serve", "--ready-file", ready}, args...)...)
	s.cmd.Stderr = s
	if err := c.Start(p, s.cmd); err != nil {
		s.cancel()
		return nil, err
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	if err := WaitReady(ctx, ready, 10*time.Second, s.done); err != nil {
		s.Stop()
		s.mu.Lock()
		defer s.mu.Unlock()
		return nil, fmt.Errorf("workload serve %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(s.stderr.String()))
	}
	return s, nil
}

// WaitReady polls until path exists. It fails after timeout, when ctx
// ends, or when exited (may be nil) is closed first.
func WaitReady(ctx context.Context, path string, timeout time.Duration, exited <-chan struct{}) error {
	deadline := time.After(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-exited:
			if _, err := os.Stat(path); err == nil {
				return nil
			}
			return errors.New("exited before it was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("not ready after %s", timeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Phases is a running `workload pingpong --phases`: one process that runs
// a ping-pong phase on a fresh connection each time Run asks, so that the
// phases of a paired bench do not each pay a process's start.
type Phases struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr bytes.Buffer
	pp     PingPongArgs
}

// StartPhases starts `workload pingpong --phases` in p with pp's address,
// size, round trips and warm-up (one connection a phase, back to back).
func (c Client) StartPhases(ctx context.Context, p Pod, pp PingPongArgs) (*Phases, error) {
	if pp.Interval > 0 || pp.Raw || pp.Conns > 1 {
		return nil, errors.New("pingpong phases: one connection a phase, back to back, summaries only")
	}
	ph := &Phases{pp: pp}
	var pctx context.Context
	pctx, ph.cancel = context.WithCancel(ctx)
	ph.cmd = p.Cmd(pctx, c.Exe, "workload", "pingpong", "--phases", "--addr", pp.Addr, "--size", strconv.Itoa(pp.Size),
		"--n", strconv.Itoa(pp.N), "--warmup", strconv.Itoa(pp.Warmup))
	ph.cmd.Stderr = &ph.stderr
	var err error
	if ph.in, err = ph.cmd.StdinPipe(); err != nil {
		ph.cancel()
		return nil, err
	}
	out, err := ph.cmd.StdoutPipe()
	if err != nil {
		ph.cancel()
		return nil, err
	}
	ph.out = bufio.NewScanner(out)
	if err := c.Start(p, ph.cmd); err != nil {
		ph.cancel()
		return nil, err
	}
	return ph, nil
}

// Run runs one phase and returns its result (CPUSeconds: the client's).
func (ph *Phases) Run() (PingPongResult, error) {
	var res PingPongResult
	if _, err := io.WriteString(ph.in, "run\n"); err != nil {
		return res, ph.fail(err)
	}
	if !ph.out.Scan() {
		return res, ph.fail(fmt.Errorf("no result (%v)", ph.out.Err()))
	}
	if err := json.Unmarshal(ph.out.Bytes(), &res); err != nil {
		return res, ph.fail(fmt.Errorf("%q: %w", ph.out.Bytes(), err))
	}
	return res, nil
}

// fail ends the process, then names it with what it wrote to stderr (read
// once it is gone: exec's copier writes the buffer until then).
func (ph *Phases) fail(err error) error {
	ph.cancel()
	ph.cmd.Wait()
	return fmt.Errorf("pingpong phases to %s: %w: %s", ph.pp.Addr, err, strings.TrimSpace(ph.stderr.String()))
}

// Close ends the process (stdin closed) and waits for it.
func (ph *Phases) Close() error {
	ph.in.Close()
	err := ph.cmd.Wait()
	ph.cancel()
	if err != nil {
		return fmt.Errorf("pingpong phases to %s: %w: %s", ph.pp.Addr, err, ph.stderr.String())
	}
	return nil
}
