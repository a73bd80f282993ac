package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// Real programs blocked on a read while something interrupts the wait.
// tcp_bpf_recvmsg answers EAGAIN whenever tcp_msg_wait_data returns without
// data (a signal, a stop, a cgroup freeze); plain TCP returns EINTR or
// restarts. eagainPrograms records, program by program, what the
// application observes when accelerated; plain TCP always delivers the data.

const (
	gateBody = "hello from the gate\n"
	// sigJDK is SIGRTMAX-2, which the JDK catches and sends to a thread
	// blocked in I/O to wake it (NativeThread.signal).
	sigJDK = syscall.Signal(62)
)

type eagainProgram struct {
	name   string
	server string // "raw", "http": gate_server.py; "redis": redis-server
	argv   func(host string, port int) []string
	sig    syscall.Signal // a signal the program catches, sent to the blocked thread; 0: it catches none
	parse  func(stdout, stderr string, err error) string
	// accelerated: what the application observes per interruption when
	// accelerated. Plain TCP observes "data" in every case.
	accelerated map[string]string
}

// Debian's python3 (registered as python3), by path: a pyenv shim may come first in PATH.
const python = "/usr/bin/python3"

var eagainPrograms = []eagainProgram{
	{name: "python-recv", server: "raw", sig: syscall.SIGALRM, parse: parseJSONResult,
		argv: func(h string, p int) []string { return pyClient(h, p, "recv") },
		accelerated: map[string]string{"none": "data", "signal": "BlockingIOError(EAGAIN)",
			"stop": "BlockingIOError(EAGAIN)", "freeze": "BlockingIOError(EAGAIN)"}},
	{name: "python-recv-sarestart", server: "raw", sig: syscall.SIGALRM, parse: parseJSONResult,
		argv: func(h string, p int) []string { return pyClient(h, p, "recv_sarestart") },
		accelerated: map[string]string{"none": "data", "signal": "BlockingIOError(EAGAIN)",
			"stop": "BlockingIOError(EAGAIN)", "freeze": "BlockingIOError(EAGAIN)"}},
	{name: "python-makefile-readline", server: "raw", sig: syscall.SIGALRM, parse: parseJSONResult,
		argv: func(h string, p int) []string { return pyClient(h, p, "makefile") },
		accelerated: map[string]string{"none": "data", "signal": "short:b''",
			"stop": "short:b''", "freeze": "short:b''"}},
	{name: "python-settimeout", server: "raw", sig: syscall.SIGALRM, parse: parseJSONResult,
		argv:        func(h string, p int) []string { return pyClient(h, p, "timeout") },
		accelerated: map[string]string{"none": "data", "signal": "data", "stop": "data", "freeze": "data"}},
	{name: "java-inputstream-read", server: "raw", sig: sigJDK, parse: parseJSONResult,
		argv: func(h string, p int) []string {
			return []string{"java", "-XX:ErrorFile=" + filepath.Join(javaClasses, "hs_err_%p.log"), "-cp", javaClasses, "BlockingClient", h, strconv.Itoa(p)}
		},
		accelerated: map[string]string{"none": "data", "signal": "data", "stop": "data", "freeze": "data"}},
	{name: "curl", server: "http", parse: parseBody(gateBody),
		argv: func(h string, p int) []string {
			return []string{"curl", "-sS", "http://" + h + ":" + strconv.Itoa(p) + "/"}
		},
		accelerated: map[string]string{"none": "data", "stop": "data", "freeze": "data"}},
	{name: "redis-cli-blpop", server: "redis", parse: parseBody("eagain\nv\n"),
		argv: func(h string, p int) []string {
			return []string{"redis-cli", "-h", h, "-p", strconv.Itoa(p), "BLPOP", "eagain", "0"}
		},
		accelerated: map[string]string{"none": "data",
			"stop":   "exit status 1: Error: Resource temporarily unavailable",
			"freeze": "exit status 1: Error: Resource temporarily unavailable"}},
}

var javaClasses string // compiled BlockingClient, set by TestEagainPrograms

func pyClient(h string, p int, mode string) []string {
	return []string{python, testdata("blocking_client.py"), h, strconv.Itoa(p), mode}
}

func testdata(name string) string {
	abs, err := filepath.Abs(filepath.Join("testdata", "eagain", name))
	if err != nil {
		panic(err)
	}
	return abs
}

func parseJSONResult(stdout, stderr string, err error) string {
	var r struct{ Result string }
	if jerr := json.Unmarshal([]byte(stdout), &r); jerr != nil || r.Result == "" {
		return fmt.Sprintf("no result (%v): %q", err, stdout)
	}
	return r.Result
}

func parseBody(want string) func(string, string, error) string {
	return func(stdout, stderr string, err error) string {
		if err == nil && stdout == want {
			return "data"
		}
		return fmt.Sprintf("%v: %s", err, strings.TrimSpace(stdout+" "+stderr))
	}
}

// jvmCrashed is how the JVM's own fatal error handler starts its report.
const jvmCrashed = "A fatal error has been detected by the Java Runtime Environment"

// compileJava runs javac, again when the JVM itself crashed: under qemu TCG
// (the kernel matrix) javac's JIT-compiled code has died of SIGILL at a
// freshly patched instruction (1 run in 7, in java.lang.StringLatin1.hashCode),
// which says nothing of the kernel under test. Its error report goes to the
// test's directory, not the working directory or /tmp.
func compileJava(t *testing.T, dir, src string) {
	errorFile := "-J-XX:ErrorFile=" + filepath.Join(t.TempDir(), "hs_err_%p.log")
	for attempt := 1; ; attempt++ {
		out, err := sysexec.Command(context.Background(), "javac", errorFile, "-d", dir, src).CombinedOutput()
		if err == nil {
			return
		}
		if attempt == 3 || !strings.Contains(string(out), jvmCrashed) {
			t.Fatalf("javac (attempt %d): %v\n%s", attempt, err, out)
		}
		t.Logf("javac's JVM crashed (attempt %d), compiling again: %v\n%s", attempt, err, out)
	}
}

// TestEagainPrograms runs each program against a server that answers only
// when the test says so; meanwhile the test waits until the program sleeps
// in the kernel, interrupts that sleep, then lets the server answer. Plain
// TCP must deliver the data every time; accelerated runs must observe
// exactly eagainPrograms' table. Last, --exclude-ports must cure a program
// that breaks.
func TestEagainPrograms(t *testing.T) {
	for _, tool := range []string{python, "java", "javac", "curl", "redis-cli", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is required (scripts/install-deps.sh): %v", tool, err)
		}
	}
	javaClasses = t.TempDir()
	os.Chmod(javaClasses, 0o755)
	compileJava(t, javaClasses, testdata("BlockingClient.java"))

	e := newEnv(t, "eag", 57)
	a, b, u := e.pod("a", true), e.pod("b", true), e.pod("u", false)
	const redisPort = 6390
	e.startIn(b, "redis-server", "--port", strconv.Itoa(redisPort), "--bind", "0.0.0.0", "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--logfile", "")
	waitListen(t, b, redisPort)

	port := 7300
	type key struct{ prog, intr string }
	plain := map[key]string{}
	run := func(t *testing.T, p eagainProgram, intr string) string {
		port++
		host, srvPort := b.IPv4.String(), port
		var release func()
		switch p.server {
		case "redis":
			srvPort = redisPort
			redis := func(args ...string) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				cmd := u.Cmd(ctx, "redis-cli", append([]string{"-h", host, "-p", strconv.Itoa(redisPort)}, args...)...)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("redis-cli %v: %v: %s", args, err, out)
				}
			}
			redis("DEL", "eagain") // a client that gave up leaves the last push behind
			release = func() { redis("RPUSH", "eagain", "v") }
		default:
			release = e.gateServer(b, port, p.server)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := a.Cmd(ctx, p.argv(host, srvPort)[0], p.argv(host, srvPort)[1:]...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := a.Start(cmd); err != nil {
			t.Fatal(err)
		}
		// nsenter without --pid execs the program: cmd's pid is the program's.
		pid := cmd.Process.Pid
		tid := waitBlocked(t, pid, func() string { return stderr.String() })
		if p.sig == 0 {
			// Only a stop, a freeze or a fatal signal can wake it.
			if cgt := sigCaught(t, pid); cgt != "0000000000000000" {
				t.Errorf("%s catches signals (SigCgt %s): add a signal case", p.name, cgt)
			}
		}
		if intr != "none" {
			interrupt(t, a, pid, tid, intr, p.sig)
		}
		release()
		err := cmd.Wait()
		if s := stderr.String(); s != "" {
			t.Logf("%s stderr: %s", p.name, s)
		}
		return p.parse(stdout.String(), stderr.String(), err)
	}
	interrupts := func(p eagainProgram) []string {
		if p.sig == 0 {
			return []string{"none", "stop", "freeze"}
		}
		return []string{"none", "signal", "stop", "freeze"}
	}

	t.Run("plain", func(t *testing.T) {
		for _, p := range eagainPrograms {
			for _, intr := range interrupts(p) {
				t.Run(p.name+"/"+intr, func(t *testing.T) {
					got := run(t, p, intr)
					plain[key{p.name, intr}] = got
					t.Logf("plain TCP: %s", got)
					if got != "data" {
						t.Errorf("plain TCP: want data, observed %s", got)
					}
				})
			}
		}
	})

	e.accelerate()
	t.Run("accelerated", func(t *testing.T) {
		for _, p := range eagainPrograms {
			for _, intr := range interrupts(p) {
				t.Run(p.name+"/"+intr, func(t *testing.T) {
					before := e.counters()
					got := run(t, p, intr)
					d := delta(before, e.counters())
					t.Logf("MEASURED %-26s %-7s plain=%s accelerated=%s", p.name, intr, plain[key{p.name, intr}], got)
					if d["pairs"] != 1 {
						t.Errorf("want the program's connection accelerated (1 pair), counters %v", d)
					}
					want := p.accelerated[intr]
					if kernelReceiveFixed(t) {
						want = "data" // a blocking read waits on, as on plain TCP
					}
					if got != want {
						t.Errorf("accelerated: want %s, observed %s", want, got)
					}
				})
			}
		}
	})

	// The opt-out: excluding the server port keeps a breaking program on
	// plain TCP, where it observes the data.
	t.Run("exclude-ports", func(t *testing.T) {
		e.dp.Close()
		if err := datapath.Uninstall(e.cfg, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		cfg := e.cfg
		excluded := port + 1 // the port run() gives the next gate server
		cfg.Select = datapath.Selection{ExcludePorts: []uint16{uint16(excluded)}}
		dp, err := datapath.Install(cfg, []string{e.lab.Managed})
		if err != nil {
			t.Fatal(err)
		}
		e.dp = dp
		before := e.counters()
		got := run(t, eagainPrograms[0], "signal")
		d := delta(before, e.counters())
		if got != "data" || d["pairs"] != 0 || d["fallback_excluded"] != 1 {
			t.Errorf("with --exclude-ports %d: want data on plain TCP (0 pairs, 1 fallback_excluded), observed %s, counters %v", excluded, got, d)
		}
	})
}

// gateServer starts gate_server.py in p and returns the function that makes it answer.
func (e *env) gateServer(p *netlab.Pod, port int, mode string) func() {
	t := e.t
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := p.Cmd(ctx, python, testdata("gate_server.py"), strconv.Itoa(port), mode, ready)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := p.Start(cmd); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if s := stderr.String(); s != "" {
			t.Logf("gate server: %s", s)
		}
	})
	waitFile(t, ready, func() string { return stderr.String() })
	return func() {
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			t.Fatalf("release the gate server: %v", err)
		}
	}
}

// waitListen waits until something listens on port in p's netns.
func waitListen(t *testing.T, p *netlab.Pod, port int) {
	t.Helper()
	deadline := time.Now().Add(scaled(20 * time.Second))
	for time.Now().Before(deadline) {
		out, _ := p.Cmd(context.Background(), "ss", "-Htln", "sport = :"+strconv.Itoa(port)).Output()
		if strings.TrimSpace(string(out)) != "" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("nothing listens on port %d in %s", port, p.Name)
}

// taskState reads a thread's state letter, wchan and voluntary context switches.
func taskState(pid, tid int) (state byte, wchan string, switches int, err error) {
	dir := fmt.Sprintf("/proc/%d/task/%d/", pid, tid)
	stat, err := os.ReadFile(dir + "stat")
	if err != nil {
		return 0, "", 0, err
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0, "", 0, fmt.Errorf("bad stat %q", stat)
	}
	state = stat[i+2]
	w, _ := os.ReadFile(dir + "wchan")
	status, err := os.ReadFile(dir + "status")
	if err != nil {
		return 0, "", 0, err
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "voluntary_ctxt_switches:"); ok {
			switches, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return state, string(w), switches, nil
}

// sigCaught reads the mask of signals pid has handlers for.
func sigCaught(t *testing.T, pid int) string {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "SigCgt:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no SigCgt in /proc/%d/status", pid)
	return ""
}

// sleepChans are where a thread waits for a socket: a blocking read
// (sk_wait_data, tcp_msg_wait_data) or poll/epoll.
var sleepChans = []string{"wait_woken", "poll_schedule_timeout", "do_epoll_wait", "ep_poll"}

// waitBlocked returns the thread of pid sleeping on its socket.
func waitBlocked(t *testing.T, pid int, diag func() string) int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, d := range tasks {
			tid, _ := strconv.Atoi(d.Name())
			st, w, _, err := taskState(pid, tid)
			if err != nil || st != 'S' {
				continue
			}
			// The JVM's own threads sleep in futexes; only a reader sleeps here.
			for _, c := range sleepChans {
				if strings.HasPrefix(w, c) {
					return tid
				}
			}
		}
		if st, _, _, err := taskState(pid, pid); err != nil || st == 'Z' {
			t.Fatalf("the program exited before it blocked: %s", diag())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("the program never blocked on its socket: %s", diag())
	return 0
}

// settled waits until the thread, woken by an interruption, has slept again
// (its voluntary switches grew past since) or the program exited; by then
// the read it was in has returned or restarted.
func settled(t *testing.T, pid, tid, since int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		st, _, sw, err := taskState(pid, tid)
		if err != nil || st == 'Z' || st == 'X' || (st == 'S' && sw > since) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("thread %d of %d did not settle after the interruption", tid, pid)
}

// interrupt wakes the blocked thread: "signal" (a signal it catches),
// "stop" (SIGSTOP then SIGCONT, as job control or a debugger attach) or
// "freeze" (freezing and thawing the pod's cgroup).
func interrupt(t *testing.T, pod *netlab.Pod, pid, tid int, how string, sig syscall.Signal) {
	t.Helper()
	_, _, sw, err := taskState(pid, tid)
	if err != nil {
		t.Fatal(err)
	}
	switch how {
	case "signal":
		if err := unix.Tgkill(pid, tid, sig); err != nil {
			t.Fatal(err)
		}
	case "stop":
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitTask(t, pid, tid, func(st byte) bool { return st == 'T' || st == 't' })
		_, _, sw, _ = taskState(pid, tid)
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	case "freeze":
		freeze(t, pod.Cgroup, true)
		_, _, sw, _ = taskState(pid, tid)
		freeze(t, pod.Cgroup, false)
	default:
		t.Fatalf("unknown interruption %q", how)
	}
	settled(t, pid, tid, sw)
}

func waitTask(t *testing.T, pid, tid int, ok func(byte) bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		st, _, _, err := taskState(pid, tid)
		if err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("thread %d of %d never reached the expected state", tid, pid)
}

// freeze sets cgroup.freeze and waits for cgroup.events to agree.
func freeze(t *testing.T, cg string, on bool) {
	t.Helper()
	v, want := "0", "frozen 0"
	if on {
		v, want = "1", "frozen 1"
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.freeze"), []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(filepath.Join(cg, "cgroup.freeze"), []byte("0"), 0o644) })
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		ev, err := os.ReadFile(filepath.Join(cg, "cgroup.events"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(ev), want) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s never reported %q", cg, want)
}

// kernelReceiveFixed reports whether this kernel carries kernel/patches,
// whose third patch makes tcp_bpf's blocking read wait on when woken
// without data (no spurious EAGAIN), honour MSG_WAITALL, and lets splice
// read the psock. The series is one: its first patch's function
// (shortcut.KernelBackpressure) marks it. Logged, so a run says which
// behaviour it proved.
func kernelReceiveFixed(t *testing.T) bool {
	t.Helper()
	fixed := shortcut.KernelBackpressure() == nil
	if fixed {
		t.Logf("kernel with kernel/patches: tcp_bpf's receive path reads as plain TCP's (no spurious EAGAIN, MSG_WAITALL, splice)")
	}
	return fixed
}
