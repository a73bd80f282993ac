package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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

// agent is one `eztunnel run` process.
type agent struct {
	cmd  *exec.Cmd
	logs *logbuf.Buffer
}

// startAgent starts `binary run` with extra flags and waits until it has attached.
func startAgent(t *testing.T, binary, cgroup, pin string, extra ...string) *agent {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	a := &agent{logs: &logbuf.Buffer{}}
	args := append([]string{"run", "--cgroup", cgroup, "--pin-path", pin, "--ready-file", ready}, extra...)
	a.cmd = sysexec.Command(context.Background(), binary, args...)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.cmd.Process.Kill(); a.cmd.Wait() })
	waitFile(t, ready, a.logs.String)
	return a
}

// bulkUnread is for the tests of restart, upgrade and uninstall under an
// accelerated bulk transfer. Their stream readers check every byte and are
// slower than their writers, which the shortcut never blocks: with the
// default bound the transfer switches to the kernel path (backpressure) after
// a few MiB, and nothing would be accelerated while the agent changes. 1 GiB
// keeps them on the shortcut, as before bounds existed.
var bulkUnread = []string{"--max-unread", "1073741824"}

func (a *agent) kill(t *testing.T) {
	t.Helper()
	a.cmd.Process.Signal(syscall.SIGKILL)
	a.cmd.Wait()
}

// agentEnv is the node of the agent tests: managed pods a and b, a stream
// server on b:7000, and a pin path removed (uninstalled) at cleanup.
func agentEnv(t *testing.T, name string, subnet int) (e *env, a, b *netlab.Pod, pin string) {
	t.Helper()
	e = newEnv(t, name, subnet)
	a, b = e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000")
	pin = e.cfg.PinRoot
	t.Cleanup(func() { eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
	return e, a, b, pin
}

func pinnedCounters(t *testing.T, pin string) datapath.Counters {
	t.Helper()
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = pin
	p, err := datapath.OpenPinned(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := p.ReadCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sockopsProgramID is the ID of the program behind the pinned sockops link.
func sockopsProgramID(t *testing.T, pin string) ebpf.ProgramID {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(pin, datapath.Schema, "links", "cgroup", "*", "ez_sc_sockops"))
	if len(matches) != 1 {
		t.Fatalf("pinned sockops links: %v", matches)
	}
	l, err := link.LoadPinnedLink(matches[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.Program
}

// transferDuring runs a 2 GiB byte-exact transfer (1 GiB each way) from a to
// b:7000 and calls during() once it is under way and being accelerated. The
// connection opens with a request/response (--handshake), so both
// directions take the shortcut from their first stream byte: pipelined from
// the first byte, a direction opens only when its reader catches up, which
// a busy host may not allow within the transfer. The client reads while it
// writes (--duplex): a pipelined client would leave the whole downstream
// unread in its psock (bulkUnread allows 1 GiB), and the node's TCP memory
// limit (tcp_mem) then fails writes with ENOMEM. The client holds the
// second half of its upstream until during() has returned (--pause,
// --resume-file), so bytes are still to be redirected after it on a host
// of any speed.
func (e *env) transferDuring(pin string, during func()) {
	t := e.t
	t.Helper()
	a, b := e.podByName("a"), e.podByName("b")
	c0 := pinnedCounters(t, pin)
	before := c0["bytes_redirected"]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The client pauses halfway through its upstream until resume exists,
	// made only after the event: the last 512 MiB go after it whatever
	// the host's speed (a fast host could finish all 2 GiB during it).
	resume := filepath.Join(t.TempDir(), "resume")
	args := streamCase{conns: 1, parallel: 1, up: 1 << 30, down: 1 << 30, chunk: 256 << 10, handshake: true, duplex: true}.args(hostport(b.IPv4, 7000), 9)
	cmd := a.Cmd(ctx, labBin, append(args, "--pause", "4m", "--resume-file", resume)...)
	out := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := a.Start(cmd); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(scaled(30 * time.Second)); pinnedCounters(t, pin)["bytes_redirected"]-before < 64<<20; {
		if time.Now().After(deadline) {
			t.Fatalf("transfer is not being accelerated: %s\ncounters: %v", out.String(), delta(c0, pinnedCounters(t, pin)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	during()
	mid := pinnedCounters(t, pin)["bytes_redirected"]
	if err := os.WriteFile(resume, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("transfer: %v\n%s", err, out.String())
	}
	if after := pinnedCounters(t, pin)["bytes_redirected"]; after <= mid {
		t.Errorf("the connection stopped being accelerated: bytes_redirected %d after the event, %d at the end", mid, after)
	}
}

func (e *env) podByName(name string) *netlab.Pod {
	for _, p := range e.lab.Pods() {
		if p.Name == name {
			return p
		}
	}
	e.t.Fatalf("no pod %s", name)
	return nil
}

// TestAgentKilledDuringTransfer: SIGKILL the agent in the middle of a 2 GiB
// transfer and start it again: every byte arrives, the connection stays
// accelerated, and new connections are accelerated.
func TestAgentKilledDuringTransfer(t *testing.T) {
	e, a, b, pin := agentEnv(t, "kill", 26)
	ag := startAgent(t, bin, e.lab.Managed, pin, bulkUnread...)
	e.transferDuring(pin, func() {
		ag.kill(t)
		startAgent(t, bin, e.lab.Managed, pin, bulkUnread...)
	})
	before := pinnedCounters(t, pin)
	if out, err := e.run(a, streamCase{conns: 5, parallel: 5, up: 1 << 20, down: 1 << 20, chunk: 65536}.args(hostport(b.IPv4, 7000), 3)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	requirePaired(t, delta(before, pinnedCounters(t, pin)), 5, 1, "new connections after the restart")
}

// TestUpgradeDuringTransfer: start a build with changed program code over
// the pinned datapath during a transfer: every byte arrives, the pinned links
// now run the new programs, and new connections are accelerated by them.
func TestUpgradeDuringTransfer(t *testing.T) {
	newBin := buildVariant(t)
	e, a, b, pin := agentEnv(t, "upg", 27)
	old := startAgent(t, bin, e.lab.Managed, pin, bulkUnread...)
	oldProg := sockopsProgramID(t, pin)
	e.transferDuring(pin, func() {
		// Adopts the pinned datapath; the old agent hands over (a DaemonSet
		// update with maxSurge runs both for a while).
		startAgent(t, newBin, e.lab.Managed, pin, append([]string{"--takeover"}, bulkUnread...)...)
		old.kill(t)
	})
	if sockopsProgramID(t, pin) == oldProg {
		t.Error("the pinned sockops link still runs the old program")
	}
	before := pinnedCounters(t, pin)
	if out, err := e.run(a, streamCase{conns: 5, parallel: 5, up: 1 << 20, down: 1 << 20, chunk: 65536}.args(hostport(b.IPv4, 7000), 3)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	requirePaired(t, delta(before, pinnedCounters(t, pin)), 5, 1, "new connections after the upgrade")
}

// TestReadCounterChange: an agent that cannot use the fexit (refused:
// counting with the tracepoint, or, on 6.1 which has none, gauging) hands
// over, during a ping-pong of 64 KiB messages on a paired connection, to one
// that counts with the fexit where this kernel allows it (an upgrade onto a
// build or host with fexit). 64 MiB cross each way after the handover, far
// beyond the default unread bound, so a read the new counter missed would
// switch the connection (fallback_backpressure); the connection closes with
// everything read, so no RST may be armed (on 6.1 its unread count lacks the
// reads made under the gauge: rx_gauged). Exactly the new counter's link
// stays pinned.
// Where fexit is refused both count with the tracepoint, and the test checks
// that handover instead.
func TestReadCounterChange(t *testing.T) {
	e := newEnv(t, "rcc", 30)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--echo", ":7001")
	pin := e.cfg.PinRoot
	t.Cleanup(func() { eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
	t.Setenv(bpfsys.TestRefuseEnv, "ez_sc_recv_fx")
	old := startAgent(t, bin, e.lab.Managed, pin)
	first := "tp_btf/"
	if bpfsys.Tracepoint("sock_recv_length")() != nil {
		first = "gauge"
	}
	if read := partOf(t, statusParts(t, pin).Parts, parts.ReadAccounting); !strings.HasPrefix(read.Via, first) {
		t.Fatalf("the first agent counts reads by %+v, want %s", read, first)
	}
	t.Setenv(bpfsys.TestRefuseEnv, "")

	c0, u0 := pinnedCounters(t, pin), unreadEntries(t, e)
	// The warm-up lasts until the handover is done, then 1,000 round trips
	// (64 MiB each way) run on the new agent's counter.
	done := filepath.Join(t.TempDir(), "handed-over")
	pp := e.startIn(a, labBin, "workload", "pingpong", "--addr", hostport(b.IPv4, 7001),
		"--size", "65536", "--n", "1000", "--warmup", "1", "--interval", "1ms", "--warmup-until", done)
	for deadline := time.Now().Add(scaled(20 * time.Second)); pinnedCounters(t, pin)["bytes_redirected"]-c0["bytes_redirected"] < 8<<20; {
		if time.Now().After(deadline) {
			t.Fatal("the ping-pong is not being accelerated")
		}
		time.Sleep(10 * time.Millisecond)
	}
	startAgent(t, bin, e.lab.Managed, pin, "--takeover")
	old.kill(t)
	mid := pinnedCounters(t, pin)
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := pp.Wait(); err != nil {
		t.Fatalf("ping-pong: %v", err)
	}
	d := delta(c0, pinnedCounters(t, pin))
	if after := delta(mid, pinnedCounters(t, pin)); d["pairs"] != 1 || after["bytes_redirected"] < 2*1000*65536 {
		t.Errorf("the ping-pong was not accelerated after the handover: %v since the start, %d bytes redirected after", d, after["bytes_redirected"])
	}
	if d["fallback_backpressure"] != 0 {
		t.Errorf("reads went uncounted across the handover: the connection switched (%v)", d)
	}
	// Both ends closed (their unread record goes at TCP_CLOSE, after each
	// end's close and FIN), everything read both ways.
	waitUnread(t, e, u0)
	if n := pinnedCounters(t, pin)["close_resets_armed"] - c0["close_resets_armed"]; n != 0 {
		t.Errorf("%d RSTs armed for a connection closed with everything read", n)
	}

	read := partOf(t, statusParts(t, pin).Parts, parts.ReadAccounting)
	checkReadHook(t, read)
	want, gone := "ez_sc_recv_fx", "ez_sc_recv"
	if strings.HasPrefix(read.Via, "tp_btf/") {
		want, gone = gone, want
		t.Log("fexit is refused here: the handover is between two tracepoint links")
	}
	dir := e.cfg.Dir()
	if _, err := os.Stat(bpfsys.LinkPin(dir, bpfsys.KindTracing, want)); err != nil {
		t.Errorf("the new read counter's link is not pinned: %v", err)
	}
	if _, err := os.Stat(bpfsys.LinkPin(dir, bpfsys.KindTracing, gone)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still pinned after the handover (%v)", gone, err)
	}
}

// buildVariant builds eztunnel from a copy of this tree whose sk_msg
// program has one more instruction, as a stand-in for the next release.
func buildVariant(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cp := sysexec.Command(context.Background(), "cp", "-a", filepath.Join(root, "bpf"), filepath.Join(root, "cmd"), filepath.Join(root, "internal"), filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum"), dir)
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("copy tree: %v\n%s", err, out)
	}
	skmsg := filepath.Join(dir, "bpf", "shortcut", "shortcut.bpf.c") // the sk_msg program
	src, err := os.ReadFile(skmsg)
	if err != nil {
		t.Fatal(err)
	}
	anchor := "\tif (!sk)\n\t\treturn SK_PASS;\n\tes = bpf_sk_storage_get"
	if !strings.Contains(string(src), anchor) {
		t.Fatalf("anchor for the variant not found in %s", skmsg)
	}
	changed := strings.Replace(string(src), anchor, "\tbpf_get_prandom_u32(); /* upgrade-test variant */\n"+anchor, 1)
	if err := os.WriteFile(skmsg, []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "eztunnel-next")
	for _, c := range []struct{ dir, args []string }{
		{[]string{"internal", "datapath"}, []string{"generate", "./..."}}, // bpf2go runs clang-19
		{nil, []string{"build", "-o", out, "./cmd/eztunnel"}},
	} {
		cmd := sysexec.Command(context.Background(), "go", c.args...)
		cmd.Dir = filepath.Join(append([]string{dir}, c.dir...)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, b)
		}
	}
	os.Chmod(dir, 0o755)
	return out
}

// TestUninstallUnderTraffic: uninstall during a transfer in both directions
// and during an idle keep-alive connection that sends afterwards: every byte
// arrives in order, and nothing of eztunnel is left on the cgroup or in bpffs.
func TestUninstallUnderTraffic(t *testing.T) {
	e, a, b, pin := agentEnv(t, "unin", 28)
	ag := startAgent(t, bin, e.lab.Managed, pin, bulkUnread...)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type job struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	start := func(args []string) *job {
		j := &job{cmd: a.Cmd(ctx, labBin, args...)}
		j.cmd.Stdout, j.cmd.Stderr = &j.out, &j.out
		if err := a.Start(j.cmd); err != nil {
			t.Fatal(err)
		}
		return j
	}
	keepAlive := start(append(streamCase{conns: 3, parallel: 3, up: 256 << 10, down: 256 << 10, chunk: 4096}.args(hostport(b.IPv4, 7000), 21), "--pause", "3s"))
	bulk := start(streamCase{conns: 2, parallel: 2, up: 512 << 20, down: 512 << 20, chunk: 128 << 10, handshake: true, duplex: true}.args(hostport(b.IPv4, 7000), 22))
	for deadline := time.Now().Add(scaled(20 * time.Second)); pinnedCounters(t, pin)["bytes_redirected"] < 64<<20; {
		if time.Now().After(deadline) {
			t.Fatal("traffic is not being accelerated")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Every connection is paired or a counted early-data fallback; the
	// redirected bytes above prove the bulk transfer under test is paired.
	for deadline := time.Now().Add(scaled(20 * time.Second)); ; time.Sleep(10 * time.Millisecond) {
		c := pinnedCounters(t, pin)
		if c["pairs"]+c["fallback_early_data"] == 5 {
			requirePaired(t, c, 5, 1, "before uninstall")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want 5 connections paired or early-data before uninstall: %v", c)
		}
	}
	ag.cmd.Process.Signal(syscall.SIGTERM)
	ag.cmd.Wait()
	if out, err := eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "60s"); err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	for name, j := range map[string]*job{"bulk": bulk, "keep-alive": keepAlive} {
		if err := j.cmd.Wait(); err != nil {
			t.Errorf("%s connections: %v\n%s", name, err, j.out.String())
		}
	}
	assertRemoved(t, e.lab.Managed, pin)
}

// TestOtherSchemaRefused: a datapath pinned by a build with another map
// layout is refused with a message, and nothing is attached.
func TestOtherSchemaRefused(t *testing.T) {
	e := newEnv(t, "schm", 29)
	pin := e.cfg.PinRoot
	old := filepath.Join(pin, "v0")
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pin) })
	out, err := eztunnelOut("run", "--cgroup", e.lab.Managed, "--pin-path", pin)
	if err == nil || !strings.Contains(out, "schema v0") {
		t.Fatalf("want a refusal naming schema v0, got %v:\n%s", err, out)
	}
	if n := attachedPrograms(t, e.lab.Managed); n != 0 {
		t.Errorf("%d programs attached", n)
	}
	if _, err := os.Stat(filepath.Join(pin, datapath.Schema)); !os.IsNotExist(err) {
		t.Errorf("pins created next to the other schema")
	}
}

// TestAnotherSockmapUser: when another sockmap user already owns the
// sockets (here a second datapath attached to the same cgroup first), our
// insert fails with EBUSY: it is counted, and every byte still arrives.
func TestAnotherSockmapUser(t *testing.T) {
	e := newEnv(t, "busy", 32)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000")
	other := e.cfg
	other.PinRoot = e.pin("/sys/fs/bpf/eztest-busy-other")
	first, err := datapath.Install(other, []string{e.lab.Managed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		first.Close()
		if err := datapath.Uninstall(other, 10*time.Second); err != nil {
			t.Errorf("uninstall other: %v", err)
		}
	})
	e.accelerate() // attached second: runs after the other user's sockops
	c := streamCase{conns: 10, parallel: 10, up: 256 << 10, down: 256 << 10, chunk: 8192}
	d := e.streamCounted(a, c, hostport(b.IPv4, 7000), 4)
	if d["fallback_ebusy"] == 0 || d["pairs"] != 0 {
		t.Errorf("want EBUSY fallbacks and no pairs of ours: %v", d)
	}
}
