package e2e

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/internal/tracer"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

// traceOut is what one `eztunnel trace` process wrote.
type traceOut struct {
	header  []string
	rows    []map[string]string
	summary struct {
		Counters map[string]uint64 `json:"counters"`
		Packets  int               `json:"packets"`
	}
}

func (o traceOut) lost() uint64 {
	return o.summary.Counters["ring_drops"] + o.summary.Counters["table_full"]
}

// startTrace starts the tracer in the host netns; the returned func stops it
// with SIGINT (as Ctrl-C) and parses its CSV and JSON summary.
func startTrace(t *testing.T, args ...string) func() traceOut {
	t.Helper()
	dir := t.TempDir()
	ready, csvPath := filepath.Join(dir, "ready"), filepath.Join(dir, "trace.csv")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cmd := sysexec.Command(ctx, bin, append([]string{"trace", "-o", "json", "--csv", csvPath, "--ready-file", ready}, args...)...)
	var out bytes.Buffer
	errb := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = &out, errb
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	waitFile(t, ready, func() string { return errb.String() })
	return func() traceOut {
		t.Helper()
		cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("trace: %v: %s", err, errb.String())
		}
		var o traceOut
		if err := json.Unmarshal(out.Bytes(), &o.summary); err != nil {
			t.Fatalf("trace summary %q: %v", out.String(), err)
		}
		raw, err := os.ReadFile(csvPath)
		if err != nil {
			t.Fatal(err)
		}
		all, err := csv.NewReader(bytes.NewReader(raw)).ReadAll()
		if err != nil || len(all) == 0 {
			t.Fatalf("csv: %v", err)
		}
		o.header = all[0]
		for _, rec := range all[1:] {
			m := map[string]string{}
			for i, h := range o.header {
				m[h] = rec[i]
			}
			o.rows = append(o.rows, m)
		}
		t.Logf("trace: %d packets, counters %v", o.summary.Packets, o.summary.Counters)
		return o
	}
}

// stages lists the ordered stages with a timestamp, in path (column) order.
func (o traceOut) stages(row map[string]string) []string {
	var s []string
	for _, h := range o.header {
		if strings.HasPrefix(h, "ts_") && row[h] != "" && !strings.HasSuffix(h, "_xmit_done") {
			s = append(s, strings.TrimPrefix(h, "ts_"))
		}
	}
	return s
}

func num(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("parse %q: %v", s, err)
	}
	return v
}

// checkRows checks every row's invariants and returns the data rows per
// direction ("a>b", "b>a").
func checkRows(t *testing.T, o traceOut, a, b *netlab.Pod, proto string, port string, minLen uint64) map[string][]map[string]string {
	t.Helper()
	dirs := map[string][]map[string]string{}
	for _, r := range o.rows {
		if r["proto"] != proto || (r["sport"] != port && r["dport"] != port) {
			t.Fatalf("filter let through %s %s:%s > %s:%s", r["proto"], r["src"], r["sport"], r["dst"], r["dport"])
		}
		st := o.stages(r)
		var prev, sum uint64
		for i, s := range st {
			ts := num(t, r["ts_"+s])
			if i > 0 {
				if ts < prev {
					t.Fatalf("stage %s at %d before the previous stage (%d): %v", s, ts, prev, st)
				}
				sum += ts - prev
			}
			prev = ts
		}
		total := num(t, r["total_ns"])
		if sum > total {
			t.Fatalf("stage sum %d exceeds the total %d", sum, total)
		}
		var nf uint64
		for _, h := range o.header {
			if strings.HasPrefix(h, "nf_") {
				nf += num(t, r[h])
			}
		}
		if nf > total {
			t.Fatalf("netfilter time %d exceeds the total %d: %v", nf, total, r)
		}
		if num(t, r["len"]) < minLen {
			continue
		}
		switch {
		case r["src"] == a.IPv4.String() && r["dst"] == b.IPv4.String():
			dirs["a>b"] = append(dirs["a>b"], r)
		case r["src"] == b.IPv4.String() && r["dst"] == a.IPv4.String():
			dirs["b>a"] = append(dirs["b>a"], r)
		default:
			t.Fatalf("filter let through %s > %s", r["src"], r["dst"])
		}
	}
	return dirs
}

// wantPath checks that each row has exactly the expected stages, in order,
// then optionally "sock" (queued to the socket), "copy" (the read) and
// "free": a free through a path without tracepoint (TCP's __kfree_skb,
// deferred frees) leaves it out, as does a read of a segment TCP coalesced
// into one still queued. The queueing and the read must be there on all but
// missCopy rows when needCopy; each row without them is logged with its
// place in the direction's sequence.
func wantPath(t *testing.T, o traceOut, rows []map[string]string, want []string, needCopy bool, missCopy int) {
	t.Helper()
	w := strings.Join(want, " ")
	missing := 0
	for i, r := range rows {
		got := strings.Join(o.stages(r), " ")
		tail, ok := strings.CutPrefix(got, w)
		tail = strings.TrimSpace(tail)
		queued := tail == "sock" || strings.HasPrefix(tail, "sock ")
		rest := strings.TrimSpace(strings.TrimPrefix(tail, "sock"))
		if !ok || (rest != "" && rest != "copy" && rest != "free" && rest != "copy free") {
			t.Fatalf("stages\n got: %s\nwant: %s [sock] [copy] [free]", got, w)
		}
		if needCopy && (!queued || !strings.HasPrefix(rest, "copy")) {
			missing++
			t.Logf("row %d of %d without the socket queue or the read stage: %s: %v", i+1, len(rows), got, r)
			if missing > missCopy {
				t.Fatalf("%d packets of %d without the socket queue or the read stage (at most %d)", missing, len(rows), missCopy)
			}
		}
	}
}

// hostForward lists the host stages of a packet the host forwards between
// two pods: the netfilter hooks it passes are the host's own IPv4 base
// chains (a firewall, kube-proxy's tables, iptables-nft's leftovers), which
// the tracer times because the host ("") is among its namespaces.
func hostForward(t *testing.T) []string {
	t.Helper()
	chains, err := tracer.BaseChains("")
	if err != nil {
		t.Fatal(err)
	}
	at := map[link.NetfilterInetHook]bool{}
	for _, c := range chains {
		if c.Family == link.NetfilterProtoIPv4 {
			at[c.Hook] = true
		}
	}
	s := []string{"h_rx", "h_recv"}
	for _, h := range []struct {
		hook  link.NetfilterInetHook
		stage string
	}{{link.NetfilterInetPreRouting, "h_nf_pre"}, {link.NetfilterInetForward, "h_nf_fwd"}, {link.NetfilterInetPostRouting, "h_nf_post"}} {
		if at[h.hook] {
			s = append(s, h.stage)
		}
	}
	t.Logf("host base chains %v: the host's stages are %v", chains, s)
	return append(s, "h_queue", "h_xmit")
}

func TestTrace(t *testing.T) {
	e := newEnv(t, "trc", 40)
	a, b := e.pod("a", false), e.pod("b", false)
	e.serve(b, "--echo", ":7001")
	udpReady := filepath.Join(t.TempDir(), "udp")
	e.startIn(b, labBin, "workload", "udp", "--serve", ":7002", "--ready-file", udpReady)
	waitFile(t, udpReady, func() string { return "udp echo" })
	const n = 200
	tcx := []string{"--tcx", a.NetNS + ":eth0", "--tcx", b.NetNS + ":eth0", "--netns", "," + a.NetNS + "," + b.NetNS}
	tx := append([]string{"p_tcxe_first", "p_tcxe_last", "p_queue", "p_xmit"}, hostForward(t)...)
	rx := []string{"p_rx", "p_recv", "p_tcxi_first", "p_tcxi_last"}
	path := func(nfIn bool) []string {
		p := append(append([]string{}, tx...), rx...)
		if nfIn {
			p = append(p, "p_nf_in")
		}
		return p
	}
	tcp := func() {
		if out, err := e.run(a, "workload", "pingpong", "--addr", hostport(b.IPv4, 7001), "--size", "100", "--n", strconv.Itoa(n), "--warmup", "0"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	udp := func() {
		out, err := e.run(a, "workload", "udp", "--addr", hostport(b.IPv4, 7002), "--size", "100", "--n", strconv.Itoa(n))
		if err != nil || !strings.Contains(out, `"echoed":200`) {
			t.Fatalf("udp: %v: %s", err, out)
		}
	}
	count := func(o traceOut, dirs map[string][]map[string]string) {
		for _, d := range []string{"a>b", "b>a"} {
			// Every packet is traced or counted lost, and some were traced:
			// wantPath must have rows to check.
			if got := uint64(len(dirs[d])); got == 0 || got > n || got+o.lost() < n {
				t.Errorf("%s: %d data packets traced, %d sent, %d counted lost", d, got, n, o.lost())
			}
		}
	}

	for _, rules := range []bool{false, true} {
		if rules {
			// A filter-table INPUT rule in b: only LOCAL_IN of b gets a chain.
			nsExec(t, b.NetNS, "iptables", "-w", "-A", "INPUT", "-p", "tcp", "-j", "ACCEPT")
		}
		t.Run("tcp/rules="+strconv.FormatBool(rules), func(t *testing.T) {
			stop := startTrace(t, append([]string{"--host", b.IPv4.String(), "--proto", "tcp", "--port", "7001"}, tcx...)...)
			tcp()
			udp() // other traffic at the same time: the filter must leave it out
			o := stop()
			dirs := checkRows(t, o, a, b, "tcp", "7001", 100)
			count(o, dirs)
			// At most 3 of 200 rows without the queueing or the read.
			// The first message follows the client's 4-byte size header
			// at once, and TCP coalesces it into the header's sk_buff
			// while that is unread: in the receive queue (tcp_queue_rcv:
			// queued, never read as itself, its lifetime ended by the
			// address's reuse) or, while the server holds the socket, in
			// the backlog (tcp_add_backlog: neither stage). A CI run
			// under make test's parallel load once had a second row
			// without either stage, its cause not found: wantPath logs
			// each such row.
			wantPath(t, o, dirs["a>b"], path(rules), true, 3)
			wantPath(t, o, dirs["b>a"], path(false), true, 3)
			for _, r := range dirs["a>b"] {
				if rules && num(t, r["nf_p_in_filter_ns"]) == 0 {
					t.Fatalf("INPUT filter chain without time: %v", r)
				}
			}
		})
		t.Run("udp/rules="+strconv.FormatBool(rules), func(t *testing.T) {
			stop := startTrace(t, append([]string{"--host", b.IPv4.String(), "--proto", "udp", "--port", "7002"}, tcx...)...)
			udp()
			tcp()
			o := stop()
			dirs := checkRows(t, o, a, b, "udp", "7002", 100)
			count(o, dirs)
			wantPath(t, o, dirs["a>b"], path(rules), false, 0)
			wantPath(t, o, dirs["b>a"], path(false), false, 0)
		})
	}
}

// TestTraceOutputs: the raw_tp fallback sees the same packets, and the CDF
// plots (SVG and PNG) and the live histogram are written.
func TestTraceOutputs(t *testing.T) {
	e := newEnv(t, "trc2", 41)
	a, b := e.pod("a", false), e.pod("b", false)
	e.serve(b, "--echo", ":7001")
	plot := filepath.Join(t.TempDir(), "cdf")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := sysexec.Command(ctx, labBin, "trace", "--raw-tp", "--live", "-o", "json", "--plot", plot, "--port", "7001", "--proto", "tcp", "--ready-file", ready)
	var out bytes.Buffer
	errb := &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = &out, errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	waitFile(t, ready, errb.String)
	if o, err := e.run(a, "workload", "pingpong", "--addr", hostport(b.IPv4, 7001), "--size", "100", "--n", "200", "--warmup", "0"); err != nil {
		t.Fatalf("%v: %s", err, o)
	}
	time.Sleep(1500 * time.Millisecond) // one live redraw
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("trace: %v: %s", err, errb.String())
	}
	all := out.String() + errb.String()
	var summary struct {
		Packets int `json:"packets"`
	}
	if i := strings.LastIndex(out.String(), "\n{"); i >= 0 {
		json.Unmarshal([]byte(out.String()[i+1:]), &summary)
	} else {
		json.Unmarshal(out.Bytes(), &summary)
	}
	if summary.Packets < 400 {
		t.Errorf("raw_tp tracer saw %d packets, want at least 400 (200 round trips):\n%s", summary.Packets, all)
	}
	for _, ext := range []string{".svg", ".png"} {
		if fi, err := os.Stat(plot + ext); err != nil || fi.Size() == 0 {
			t.Errorf("plot %s%s missing or empty: %v", plot, ext, err)
		}
	}
	if !strings.Contains(errb.String(), "per-packet total latency, last second (n=") || !strings.Contains(errb.String(), "lost 0 (ring 0, table 0)") {
		t.Errorf("no live histogram (or losses) in the output:\n%s", errb.String())
	}
}
