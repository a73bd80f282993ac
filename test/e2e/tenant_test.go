package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/netprobe"
	"github.com/eztunnel/eztunnel/internal/testpacket"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// The tenant tests play a selected pod that owns its network namespace
// (NET_ADMIN and NET_RAW inside its pod: a VPN sidecar, a mesh init
// container, a pod with hostUsers: false). It may put any address on its
// own loopback, forge packets into its own namespace and drop its own
// packets. No byte of another pod may reach it, and nobody outside may
// leave state behind that outlives a plain TCP handshake.

// tenantEnv is Kubernetes mode's datapath without Kubernetes (see
// TestCgroupScope): hooks at the lab's root cgroup with the cgroup filter;
// set selects pods by cgroup.
func tenantEnv(t *testing.T, name string, subnet int) (e *env, set func(...*netlab.Pod)) {
	t.Helper()
	e = newEnv(t, name, subnet)
	e.cfg.CgroupFilter = true
	set = func(pods ...*netlab.Pod) {
		t.Helper()
		if e.dp == nil {
			dp, err := datapath.Install(e.cfg, []string{filepath.Dir(e.lab.Managed)})
			if err != nil {
				t.Fatal(err)
			}
			e.dp = dp
			t.Cleanup(func() {
				dp.Close()
				if err := datapath.Uninstall(e.cfg, 10*time.Second); err != nil {
					t.Errorf("uninstall: %v", err)
				}
			})
		}
		var ids []uint64
		for _, p := range pods {
			ids = append(ids, cgroupID(t, p.Cgroup))
		}
		if _, _, err := e.dp.SetScope(ids); err != nil {
			t.Fatal(err)
		}
	}
	return e, set
}

// sink starts `workload sink` on addr in p and waits until it listens.
func (e *env) sink(p *netlab.Pod, addr netip.AddrPort, reply string) *logbuf.Buffer {
	e.t.Helper()
	ready := filepath.Join(e.t.TempDir(), "ready")
	_, log := e.startLogged(p, labBin, "workload", "sink", "--addr", addr.String(), "--reply", reply, "--ready-file", ready)
	waitFile(e.t, ready, log.String)
	return log
}

// sinkOutside starts `workload sink` on addr in p's namespace but outside
// the lab's cgroups: a server no eztunnel hook sees (another node, the
// other side of the world).
func (e *env) sinkOutside(p *netlab.Pod, addr netip.AddrPort) *logbuf.Buffer {
	e.t.Helper()
	ready := filepath.Join(e.t.TempDir(), "ready")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := netlab.NetnsCmd(ctx, p.NetNS, labBin, "workload", "sink", "--addr", addr.String(), "--ready-file", ready)
	log := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		cancel()
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cancel(); cmd.Wait() })
	waitFile(e.t, ready, log.String)
	return log
}

// tenantEvents parses the JSON lines of workload sink or send.
func tenantEvents(t *testing.T, out string) (received string, connected, sent bool) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var ev struct {
			Connected bool   `json:"connected"`
			Data      string `json:"data"`
			Sent      int    `json:"sent"`
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("bad event %q: %v", line, err)
		}
		received += ev.Data
		connected = connected || ev.Connected
		sent = sent || ev.Sent > 0
	}
	return received, connected, sent
}

func waitUntil(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(scaled(within))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawTCP is a raw IPv4 TCP socket in a pod's namespace: it sends whole
// packets (IP_HDRINCL) and receives a copy of every TCP packet delivered
// there.
type rawTCP struct{ fd int }

func openRaw(t *testing.T, p *netlab.Pod) *rawTCP {
	t.Helper()
	r := &rawTCP{fd: -1}
	err := p.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		r.fd = fd
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_HDRINCL, 1); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20); err != nil {
			return err
		}
		tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if r.fd >= 0 {
		t.Cleanup(func() { unix.Close(r.fd) })
	}
	if err != nil {
		t.Fatalf("raw socket in %s: %v", p.Name, err)
	}
	return r
}

func (r *rawTCP) send(t *testing.T, src, dst netip.AddrPort, seq, ack uint32, flags uint8) {
	t.Helper()
	seg := testpacket.TCP{SrcPort: src.Port(), DstPort: dst.Port(), Seq: seq, Ack: ack, Flags: flags, Window: 65535}.Segment(nil)
	seg = testpacket.WithL4Checksum(src.Addr(), dst.Addr(), 6, seg)
	pkt := testpacket.IPv4{Src: src.Addr().String(), Dst: dst.Addr().String(), Proto: 6, TTL: 64}.Packet(seg)
	if err := unix.Sendto(r.fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.Addr().As4()}); err != nil {
		t.Fatalf("send %v -> %v: %v", src, dst, err)
	}
}

// segment is what recv reports of one received TCP packet.
type segment struct {
	src, dst netip.AddrPort
	seq, ack uint32
	flags    uint8
}

// recv returns the next TCP packet, ok false when none came within the
// socket's timeout.
func (r *rawTCP) recv() (segment, bool) {
	buf := make([]byte, 2048)
	n, _, err := unix.Recvfrom(r.fd, buf, 0)
	if err != nil || n < 40 {
		return segment{}, false
	}
	b := buf[:n]
	hl := int(b[0]&0xf) * 4
	if len(b) < hl+20 {
		return segment{}, false
	}
	src, _ := netip.AddrFromSlice(b[12:16])
	dst, _ := netip.AddrFromSlice(b[16:20])
	l4 := b[hl:]
	return segment{
		src:   netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:])),
		dst:   netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:])),
		seq:   binary.BigEndian.Uint32(l4[4:]),
		ack:   binary.BigEndian.Uint32(l4[8:]),
		flags: l4[13],
	}, true
}

// await returns the first segment from src to dst whose flags are exactly flags.
func (r *rawTCP) await(t *testing.T, src, dst netip.AddrPort, flags uint8, within time.Duration) segment {
	t.Helper()
	deadline := time.Now().Add(scaled(within))
	for time.Now().Before(deadline) {
		if s, ok := r.recv(); ok && s.src == src && s.dst == dst && s.flags&(tcpSYN|tcpACK|tcpRST|tcpFIN) == flags {
			return s
		}
	}
	t.Fatalf("no segment %v -> %v with flags %#x within %v", src, dst, flags, within)
	return segment{}
}

const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// dropSynAcks makes a namespace lose the SYN-ACKs from port in chain
// (OUTPUT where the server is, INPUT where the client is) until the
// returned function is called: the handshake takes the 1 s
// retransmission, as across the world.
func dropSynAcks(t *testing.T, netns, chain string, port uint16) (stop func()) {
	t.Helper()
	rule := []string{chain, "-p", "tcp", "--sport", strconv.Itoa(int(port)), "--tcp-flags", "SYN,ACK", "SYN,ACK", "-j", "DROP"}
	nsExec(t, netns, "iptables", append([]string{"-w", "-A"}, rule...)...)
	return func() { nsExec(t, netns, "iptables", append([]string{"-w", "-D"}, rule...)...) }
}

// dropped is the packet count of the first DROP rule of chain.
func dropped(t *testing.T, netns, chain string) uint64 {
	t.Helper()
	for _, line := range strings.Split(nsExec(t, netns, "iptables", "-w", "-L", chain, "-v", "-n", "-x"), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == "DROP" {
			n, _ := strconv.ParseUint(f[0], 10, 64)
			return n
		}
	}
	t.Fatalf("no DROP rule in %s of %s", chain, netns)
	return 0
}

// becomeTenant gives the tenant's namespace copies of addrs on loopback
// and drops every RST it would send (to its forged peers).
func becomeTenant(t *testing.T, p *netlab.Pod, addrs ...netip.Addr) {
	t.Helper()
	for _, a := range addrs {
		nsExec(t, p.NetNS, "ip", "addr", "add", a.String()+"/32", "dev", "lo")
	}
	nsExec(t, p.NetNS, "iptables", "-w", "-A", "OUTPUT", "-p", "tcp", "--tcp-flags", "RST", "RST", "-j", "DROP")
}

// TestTenantHijackVictimClient: the victim (selected) connects from a fixed
// port to a server that is not selected, whose first SYN-ACK is lost. During
// the victim's handshake the tenant (selected) injects a SYN with the
// victim's tuple to its own listener on a copy of the server's address, and
// completes its fake handshake after the victim's. The victim's bytes must
// reach the real server, byte-exact, and none the tenant.
func TestTenantHijackVictimClient(t *testing.T) {
	e, set := tenantEnv(t, "tnc", 86)
	victim, tenant := e.pod("vic", true), e.pod("ten", true)
	server := e.pod("srv", false)
	set(victim, tenant)
	srv := netip.AddrPortFrom(server.IPv4, 7500)
	vic := netip.AddrPortFrom(victim.IPv4, 45000)

	stopDrop := dropSynAcks(t, server.NetNS, "OUTPUT", srv.Port())
	realLog := e.sinkOutside(server, srv)
	becomeTenant(t, tenant, server.IPv4, victim.IPv4)
	fake := e.sink(tenant, srv, "")
	raw := openRaw(t, tenant)
	before := e.counters()

	secret := strings.Repeat("VICTIM-SECRET-", 4)
	_, vlog := e.startLogged(victim, labBin, "workload", "send", "--bind", vic.String(), "--addr", srv.String(),
		"--data", secret, "--delay", "1500ms", "--read-for", "1s")
	// The victim's SYN is in: the server dropped its first SYN-ACK.
	waitUntil(t, "the server's first SYN-ACK dropped", 10*time.Second, func() bool { return dropped(t, server.NetNS, "OUTPUT") >= 1 })
	stopDrop()
	const isn = 0x1badcafe
	raw.send(t, vic, srv, isn, 0, tcpSYN)
	synack := raw.await(t, srv, vic, tcpSYN|tcpACK, 5*time.Second)
	waitUntil(t, "the victim's handshake", 10*time.Second, func() bool { _, c, _ := tenantEvents(t, vlog.String()); return c })
	raw.send(t, vic, srv, isn+1, synack.seq+1, tcpACK)
	waitUntil(t, "the tenant's fake connection accepted", 10*time.Second, func() bool { _, c, _ := tenantEvents(t, fake.String()); return c })
	waitUntil(t, "the victim's bytes somewhere", 10*time.Second, func() bool {
		r, _, _ := tenantEvents(t, realLog.String())
		f, _, _ := tenantEvents(t, fake.String())
		return len(r) >= len(secret) || f != ""
	})
	time.Sleep(200 * time.Millisecond) // let a split delivery show
	gotReal, _, _ := tenantEvents(t, realLog.String())
	gotFake, _, _ := tenantEvents(t, fake.String())
	d := delta(before, e.counters())
	if gotFake != "" {
		t.Errorf("the tenant received %d bytes of the victim's connection: %q", len(gotFake), gotFake)
	}
	if gotReal != secret {
		t.Errorf("the real server received %q, want %q", gotReal, secret)
	}
	if d["pairs"] != 0 || d["fallback_unproven"] == 0 {
		t.Errorf("want no pair and the victim's refusal counted (fallback_unproven): %v", d)
	}
	t.Logf("victim: %s\nreal server: %s\ntenant: %s\ncounters: %v", vlog, realLog, fake, d)
}

// TestTenantHijackVictimServer is the mirror: a client that is not selected
// connects from a fixed port to the victim (selected); its first SYN-ACK is
// lost. The tenant (selected) connects with the client's tuple to a copy of
// the victim's address on its own loopback, having sent its SYN first, and
// answers that SYN itself with a forged SYN-ACK once the victim registered
// the real handshake. The victim's reply must reach the real client, and no
// byte of the tenant the victim.
func TestTenantHijackVictimServer(t *testing.T) {
	e, set := tenantEnv(t, "tns", 87)
	victim, tenant := e.pod("vic", true), e.pod("ten", true)
	client := e.pod("cli", false)
	set(victim, tenant)
	srv := netip.AddrPortFrom(victim.IPv4, 7600)
	cli := netip.AddrPortFrom(client.IPv4, 46000)

	stopDrop := dropSynAcks(t, client.NetNS, "INPUT", srv.Port())
	reply := strings.Repeat("SERVER-SECRET-", 4)
	vlog := e.sink(victim, srv, reply)
	becomeTenant(t, tenant, client.IPv4, victim.IPv4)
	raw := openRaw(t, tenant)
	before := e.counters()

	_, tlog := e.startLogged(tenant, labBin, "workload", "send", "--bind", cli.String(), "--addr", srv.String(),
		"--data", "TENANT-INJECT", "--delay", "2500ms", "--read-for", "2s")
	syn := raw.await(t, cli, srv, tcpSYN, 10*time.Second)
	_, clog := e.startLogged(client, labBin, "workload", "send", "--bind", cli.String(), "--addr", srv.String(),
		"--data", "CLIENT-DATA", "--delay", "1500ms", "--read-for", "2s")
	// The victim registered the real handshake: its first SYN-ACK was lost.
	waitUntil(t, "the client's first SYN-ACK dropped", 10*time.Second, func() bool { return dropped(t, client.NetNS, "INPUT") >= 1 })
	stopDrop()
	raw.send(t, srv, cli, 0x5eed0000, syn.seq+1, tcpSYN|tcpACK)
	waitUntil(t, "the tenant's forged handshake", 10*time.Second, func() bool { _, c, _ := tenantEvents(t, tlog.String()); return c })
	waitUntil(t, "the victim's reply somewhere", 10*time.Second, func() bool {
		c, _, _ := tenantEvents(t, clog.String())
		f, _, _ := tenantEvents(t, tlog.String())
		return len(c) >= len(reply) || f != ""
	})
	waitUntil(t, "both senders done", 10*time.Second, func() bool {
		_, _, cs := tenantEvents(t, clog.String())
		_, _, ts := tenantEvents(t, tlog.String())
		return cs && ts
	})
	time.Sleep(200 * time.Millisecond)
	gotClient, _, _ := tenantEvents(t, clog.String())
	gotTenant, _, _ := tenantEvents(t, tlog.String())
	gotVictim, _, _ := tenantEvents(t, vlog.String())
	d := delta(before, e.counters())
	if gotTenant != "" {
		t.Errorf("the tenant received %d bytes of the victim's connection: %q", len(gotTenant), gotTenant)
	}
	if gotClient != reply {
		t.Errorf("the real client received %q, want %q", gotClient, reply)
	}
	if gotVictim != "CLIENT-DATA" {
		t.Errorf("the victim received %q, want only the real client's %q", gotVictim, "CLIENT-DATA")
	}
	if d["pairs"] != 0 || d["fallback_unproven"] == 0 {
		t.Errorf("want no pair and the tenant's claim refused (fallback_unproven): %v", d)
	}
	t.Logf("victim: %s\nclient: %s\ntenant: %s\ncounters: %v", vlog, clog, tlog, d)
}

// synScan sends n SYNs from from's address (source ports 20000 on) to dst
// with a raw socket in from's namespace, and waits until the listener
// answered each (its SYN-ACK is in; from's kernel answers it with RST).
func synScan(t *testing.T, from *netlab.Pod, dst netip.AddrPort, n int) {
	t.Helper()
	synScanOn(t, from, dst, n, 20000, -1)
}

// synScanEveryCPU is synScan with the SYNs sent from each CPU in turn (n
// from each). A SYN's programs run on the CPU that sends it through the
// veth, and an LRU map keeps each CPU's newest entries on that CPU's own
// lists (kernel/bpf/bpf_lru_list.c: local pending lists), which a scan
// from the other CPU evicts last: with both CPUs busy, a scan from one left
// a record made on the other in place.
func synScanEveryCPU(t *testing.T, from *netlab.Pod, dst netip.AddrPort, n int) {
	t.Helper()
	for cpu := range runtime.NumCPU() {
		synScanOn(t, from, dst, n, 20000+cpu*n, cpu)
	}
}

// synScanOn sends the SYNs from source ports firstPort on, on CPU cpu (-1:
// any).
func synScanOn(t *testing.T, from *netlab.Pod, dst netip.AddrPort, n, firstPort, cpu int) {
	t.Helper()
	if cpu >= 0 {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		restore, err := netprobe.PinThread(cpu)
		if err != nil {
			t.Fatal(err)
		}
		defer restore()
	}
	raw := openRaw(t, from)
	done := make(chan int)
	go func() {
		seen := map[uint16]bool{}
		deadline := time.Now().Add(scaled(60 * time.Second))
		for len(seen) < n && time.Now().Before(deadline) {
			if s, ok := raw.recv(); ok && s.src == dst && s.flags&(tcpSYN|tcpACK) == tcpSYN|tcpACK {
				seen[s.dst.Port()] = true
			}
		}
		done <- len(seen)
	}()
	for i := 0; i < n; i++ {
		src := netip.AddrPortFrom(from.IPv4, uint16(firstPort+i))
		raw.send(t, src, dst, uint32(i)*7919, 0, tcpSYN)
	}
	if got := <-done; got != n {
		t.Fatalf("scan: %d of %d SYNs answered", got, n)
	}
}

// pinnedEntries counts the entries of a pinned shortcut map.
func pinnedEntries(t *testing.T, pin, name string) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(pin, datapath.Schema, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	n, err := shortcut.Entries(m)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestScanUnselectedListener: a SYN scan of a listener that is not selected
// (hostNetwork pods, pods out of scope) leaves no pairing state: anyone who
// reaches a node port could otherwise fill the pairing maps.
func TestScanUnselectedListener(t *testing.T) {
	e, set := tenantEnv(t, "tsu", 88)
	sel := e.pod("sel", true)
	srv, scanner := e.pod("srv", false), e.pod("scan", false)
	set(sel)
	dst := netip.AddrPortFrom(srv.IPv4, 7700)
	e.sink(srv, dst, "")
	const n = 2000
	synScan(t, scanner, dst, n)
	pin := e.cfg.PinRoot
	pairs, index := pinnedEntries(t, pin, "ez_sc_pairs"), pinnedEntries(t, pin, "ez_sc_syn_index")
	if pairs != 0 || index != 0 {
		t.Errorf("after %d SYNs to a listener out of scope: %d pairing records, %d SYN index entries; want none", n, pairs, index)
	}
}

// TestSynScanThenSidecar: a 20,000-SYN scan (handshakes that never complete:
// the scanner's kernel answers each SYN-ACK with RST) of a selected listener
// behind a sidecar's REDIRECT. A REDIRECT pair made right after the scan
// still accelerates, and within the aging time (--pair-max-age) the scan's
// records, aliases and SYN index entries are gone (below 1%).
func TestSynScanThenSidecar(t *testing.T) {
	e := newEnv(t, "tss", 89)
	a, b := e.pod("a", true), e.pod("b", true)
	scanner := e.pod("scan", false)
	nsExec(t, b.NetNS, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "7800", "-j", "REDIRECT", "--to-ports", "7801")
	e.serve(b, "--stream", ":7801")
	pin := e.cfg.PinRoot
	t.Cleanup(func() { eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
	const maxAge = 4 * time.Second
	// Default --max-pairs (16384): the scan is larger than the maps.
	ag := startAgent(t, bin, e.lab.Managed, pin, "--pair-max-age", maxAge.String())

	const n, maxPairs = 20000, 16384
	synScan(t, scanner, netip.AddrPortFrom(b.IPv4, 7800), n)
	if idx := pinnedEntries(t, pin, "ez_sc_syn_index"); idx < maxPairs*8/10 {
		t.Fatalf("SYN index holds %d entries after the scan, want about %d (did the scan reach the listener?)", idx, maxPairs)
	}
	before := pinnedCounters(t, pin)
	if out, err := e.run(a, streamCase{conns: 1, parallel: 1, up: 1 << 20, down: 1 << 20, chunk: 16384}.args(hostport(b.IPv4, 7800), 3)...); err != nil {
		t.Fatalf("stream through the REDIRECT: %v\n%s", err, out)
	}
	d := delta(before, pinnedCounters(t, pin))
	requirePaired(t, d, 1, 1, "the sidecar pair right after the scan")
	if d["nat_aliases"] == 0 {
		t.Errorf("the REDIRECT was not learnt: %v", d)
	}
	deadline := time.Now().Add(scaled(2 * maxAge))
	for {
		pairs, aliases, index := pinnedEntries(t, pin, "ez_sc_pairs"), pinnedEntries(t, pin, "ez_sc_aliases"), pinnedEntries(t, pin, "ez_sc_syn_index")
		if pairs < n/100 && aliases < n/100 && index < n/100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the scan: %d pairing records, %d aliases, %d SYN index entries; want each below %d\nagent:\n%s",
				2*maxAge, pairs, aliases, index, n/100, ag.logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, err := eztunnelOut("status", "-o", "json", "--pin-path", pin)
	var rep struct {
		Maps map[string]datapath.MapFill `json:"maps"`
	}
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if _, ok := rep.Maps["syn_index"]; !ok {
		t.Errorf("status reports no syn_index fill: %v", rep.Maps)
	}
}

// TestMapFullLogged: a scan that fills the maps of handshakes in flight is
// no silent stop. They are LRU (bpf/shortcut/shortcut.bpf.c): at their bound the
// scan evicts the oldest entries rather than refusing new ones, and the
// agent says so in its log, once per episode (at most once per aging
// tick), until the records age out.
func TestMapFullLogged(t *testing.T) {
	e := newEnv(t, "tmf", 85)
	a, b := e.pod("a", true), e.pod("b", true)
	scanner := e.pod("scan", false)
	e.serve(b, "--stream", ":7900")
	pin := e.cfg.PinRoot
	t.Cleanup(func() { eztunnelOut("uninstall", "--pin-path", pin, "--drain-timeout", "5s") })
	const maxAge = 2 * time.Second
	ag := startAgent(t, bin, e.lab.Managed, pin, "--pair-max-age", maxAge.String(), "--max-pairs", "100")
	synScan(t, scanner, netip.AddrPortFrom(b.IPv4, 7900), 300)
	if n := pinnedEntries(t, pin, "ez_sc_syn_index"); n > 100 {
		t.Errorf("300 SYNs into an LRU map of 100: %d entries", n)
	}
	waitUntil(t, "the agent's warning", 3*maxAge, func() bool { return strings.Contains(ag.logs.String(), "datapath maps full") })
	// One scan, one warning.
	if n := strings.Count(ag.logs.String(), "datapath maps full"); n > 1 {
		t.Errorf("%d warnings for one scan, want 1:\n%s", n, ag.logs)
	}
	// Aged out, new connections pair again.
	waitUntil(t, "the scan's records aged out", 3*maxAge, func() bool { return pinnedEntries(t, pin, "ez_sc_pairs") == 0 })
	before := pinnedCounters(t, pin)
	if out, err := e.run(a, streamCase{conns: 1, parallel: 1, up: 1 << 20, down: 1 << 20, chunk: 16384}.args(hostport(b.IPv4, 7900), 4)...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	requirePaired(t, delta(before, pinnedCounters(t, pin)), 1, 1, "a connection after the scan aged out")
}
