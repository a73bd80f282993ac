package scale

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/bench/quick"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// step runs one step of n connections. ended names the resource that
// ended it (then row is not a measurement); err is a failure of the bench.
func (r *run) step(ctx context.Context, n int) (row Row, ended string, err error) {
	plan, err := PlanStep(n, r.nofile, firstPort)
	if err != nil {
		return row, "descriptors: " + err.Error(), nil
	}
	row.Conns, row.Procs = n, plan.Procs()
	availBefore, err := bench.MemAvailable()
	if err != nil {
		return row, "", err
	}
	if per, from := marginalBytes(r.rep.Steps); per > 0 {
		need := uint64(per * float64(n) * 1.1)
		if need+r.o.MinAvailable > availBefore {
			return row, fmt.Sprintf("memory: at %.0f B a connection (%s) %d connections need %.1f GiB; MemAvailable is %.1f GiB and the floor %.1f GiB",
				per, from, n, gib(need), gib(availBefore), gib(r.o.MinAvailable)), nil
		}
	}
	fmt.Fprintf(r.o.Log, "step: %d connections, %d server and %d holder processes of at most %d (MemAvailable %.1f GiB)\n", n, plan.Procs(), plan.Procs(), plan.PerProc, gib(availBefore))
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	low := watchMemory(sctx, cancel, r.o.MinAvailable)
	defer func() { row.MemAvailableLow = low() }()
	ag, stopAgent, err := r.startAgent(sctx, &row, plan)
	if err != nil {
		return row, resource(err), unlessResource(err)
	}
	var procs []*proc
	defer func() {
		cancel(nil) // kills the holders and servers
		for _, p := range procs {
			<-p.done
		}
		stopAgent()
	}()
	servers, holders, err := r.open(sctx, &row, plan, &procs)
	if err != nil {
		return row, resource(err), unlessResource(err)
	}
	if err := r.loaded(sctx, &row, ag, availBefore); err != nil {
		return row, resource(err), unlessResource(err)
	}
	if err := r.probe(sctx, &row, ag); err != nil {
		return row, resource(err), unlessResource(err)
	}
	if err := r.listAndScrape(sctx, &row, ag); err != nil {
		return row, resource(err), unlessResource(err)
	}
	if err := r.rounds(sctx, &row, ag, servers, holders); err != nil {
		return row, resource(err), unlessResource(err)
	}
	return row, "", nil
}

// marginalBytes is what one more connection cost the machine in the
// steps so far: between the two largest, or in the largest alone when it
// held at least 10,000 (smaller ones are mostly the fixed cost of the
// agent and processes); 0 when there is no such estimate.
func marginalBytes(steps []Row) (float64, string) {
	used := func(s Row) float64 { return s.NodeBytesPerConn * float64(s.Conns) }
	switch k := len(steps); {
	case k >= 2 && steps[k-1].Conns > steps[k-2].Conns:
		a, b := steps[k-2], steps[k-1]
		return (used(b) - used(a)) / float64(b.Conns-a.Conns), fmt.Sprintf("from the steps of %d and %d", a.Conns, b.Conns)
	case k >= 1 && steps[k-1].Conns >= 10000:
		return steps[k-1].NodeBytesPerConn, fmt.Sprintf("in the step of %d", steps[k-1].Conns)
	}
	return 0, ""
}

// resource names the resource an error of a step ran out of, "" if none.
func resource(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, errLowMemory):
		return "memory: " + msg
	case errors.Is(err, errTooSlow):
		return "time: " + msg
	case errors.Is(err, errAgent):
		return msg
	case strings.Contains(msg, "too many open files"):
		return "descriptors: " + msg
	case strings.Contains(msg, "cannot assign requested address"):
		return "ephemeral ports: " + msg
	case strings.Contains(msg, "cannot allocate memory") || strings.Contains(msg, "out of memory"):
		return "memory: " + msg
	}
	return ""
}

func unlessResource(err error) error {
	if resource(err) != "" {
		return nil
	}
	return err
}

// open starts the servers, then the holders, and times the holders'
// setup: every connection open and its hello echoed.
func (r *run) open(ctx context.Context, row *Row, plan Plan, procs *[]*proc) (servers, holders []*proc, err error) {
	dir := filepath.Join(r.tmp, "step-"+strconv.Itoa(plan.Conns))
	for i, port := range plan.Ports {
		d := filepath.Join(dir, "s"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, err
		}
		p, err := r.start(ctx, r.server, d, r.o.Exe, "workload", "scale-serve", "--addr", ":"+strconv.Itoa(port), "--ready-file", filepath.Join(d, "ready"))
		if err != nil {
			return nil, nil, err
		}
		*procs = append(*procs, p)
		servers = append(servers, p)
	}
	if err := waitFiles(ctx, servers, "ready", time.Minute); err != nil {
		return nil, nil, fmt.Errorf("servers: %w", err)
	}
	every := (plan.Conns + r.o.InFlight - 1) / r.o.InFlight
	start := time.Now()
	base := 0
	for i, share := range plan.Shares {
		d := filepath.Join(dir, "h"+strconv.Itoa(i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, nil, err
		}
		p, err := r.start(ctx, r.client, d, r.o.Exe, "workload", "scale-hold", "--addr", hostPort(r.server.IPv4, plan.Ports[i]),
			"--conns", strconv.Itoa(share), "--base", strconv.Itoa(base), "--parallel", strconv.Itoa(plan.PerHolder(r.o.Parallel)),
			"--every", strconv.Itoa(every), "--timeout", "30s", "--dir", d)
		if err != nil {
			return nil, nil, err
		}
		base += share
		*procs = append(*procs, p)
		holders = append(holders, p)
	}
	timeout := time.Minute + time.Duration(plan.Conns/r.o.MinSetupRate)*time.Second
	if err := waitFiles(ctx, holders, "ready.json", timeout); err != nil {
		return nil, nil, fmt.Errorf("holders: %w", err)
	}
	row.SetupWallSeconds = time.Since(start).Seconds()
	// The rate is from the holders' own clocks (the slowest holder's
	// time from its first connect to its last echoed hello): starting the
	// processes is not part of it.
	for _, h := range holders {
		var ready struct {
			Seconds float64 `json:"seconds"`
		}
		b, err := os.ReadFile(filepath.Join(h.dir, "ready.json"))
		if err == nil {
			err = json.Unmarshal(b, &ready)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("holder ready.json: %w", err)
		}
		row.SetupSeconds = max(row.SetupSeconds, ready.Seconds)
	}
	row.SetupRate = float64(plan.Conns) / row.SetupSeconds
	fmt.Fprintf(r.o.Log, "  %d connections open in %.1f s (%.0f/s; %.1f s with starting the holders)\n", plan.Conns, row.SetupSeconds, row.SetupRate, row.SetupWallSeconds)
	return servers, holders, nil
}

// loaded waits until the datapath paired every connection, then samples
// the agent's and the machine's memory.
func (r *run) loaded(ctx context.Context, row *Row, ag *agent, availBefore uint64) error {
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := quick.SampleMemory(ag.cmd.Process.Pid, ag.cfg, row.Conns)
		if err != nil {
			return err
		}
		row.Pairs, row.AgentRSS, row.MapBytes, row.ProgBytes, row.MapBytesByMap = s.Pairs, s.AgentRSS, s.MapMemlock, s.ProgMemlock, s.MapBytes
		if s.Pairs >= uint64(row.Conns) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if row.Pairs < uint64(row.Conns) {
		return fmt.Errorf("the datapath paired %d of %d connections", row.Pairs, row.Conns)
	}
	avail, err := bench.MemAvailable()
	if err != nil {
		return err
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return err
	}
	pages, err := bench.TCPMemPages(fs)
	if err != nil {
		return err
	}
	row.TCPMemBytes = uint64(pages) * uint64(os.Getpagesize())
	row.AgentBytesPerConn = float64(row.AgentRSS+row.MapBytes) / float64(row.Conns)
	if avail < availBefore {
		row.NodeBytesPerConn = float64(availBefore-avail) / float64(row.Conns)
	}
	fmt.Fprintf(r.o.Log, "  %d pairs; agent RSS %.1f MB, BPF maps %.1f MB; MemAvailable %.1f GiB; TCP memory %.1f MB\n", row.Pairs, mb(row.AgentRSS), mb(row.MapBytes), gib(avail), mb(row.TCPMemBytes))
	return nil
}

func mb(b uint64) float64 { return float64(b) / (1 << 20) }

// median is the median of the probe runs (internal/stats; its input is not
// changed).
func median(xs []float64) float64 { return stats.Summarize(xs).P50 }

// listAndScrape times one full `eztunnel connections -o json` (through
// the agent; if that fails, once more from the pins) and one scrape of the
// agent's /metrics.
func (r *run) listAndScrape(ctx context.Context, row *Row, ag *agent) error {
	var err error
	row.ListingSeconds, row.ListingBytes, row.ListedEnds, row.ListingError = list(ctx, r.o.Agent, ag.cfg.PinRoot)
	// The agent answered the listing: what that left it holding.
	if row.AgentRSSAfterListing, err = bench.ProcRSS(ag.cmd.Process.Pid); err != nil {
		return err
	}
	if row.ListingError != "" {
		fmt.Fprintf(r.o.Log, "  listing failed after %.1f s: %s\n", row.ListingSeconds, row.ListingError)
		var ferr string
		row.FromPinsSeconds, _, row.FromPinsEnds, ferr = list(ctx, r.o.Agent, ag.cfg.PinRoot, "--from-pins")
		fmt.Fprintf(r.o.Log, "  listing --from-pins: %d ends in %.2f s %s\n", row.FromPinsEnds, row.FromPinsSeconds, ferr)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ag.metrics+"/metrics", nil)
	if err != nil {
		return err
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape: %s: %v", resp.Status, err)
	}
	row.ScrapeSeconds, row.ScrapeBytes = time.Since(start).Seconds(), int64(len(body))
	// How long the agent's periodic walk of its maps (to count their
	// entries for the metrics) took last.
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "eztunnel_map_fill_walk_seconds "); ok {
			row.FillWalkSeconds, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if v, ok := strings.CutPrefix(line, "eztunnel_map_fill_walk_cpu_seconds "); ok {
			row.FillWalkCPUSeconds, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	fmt.Fprintf(r.o.Log, "  listing: %d ends, %.1f MB in %.2f s (agent RSS after it %.1f MB); scrape: %.1f kB in %.3f s (the agent's last walk of its maps: %.2f s, %.2f s of CPU)\n", row.ListedEnds, mb(uint64(row.ListingBytes)), row.ListingSeconds, mb(row.AgentRSSAfterListing), float64(row.ScrapeBytes)/1000, row.ScrapeSeconds, row.FillWalkSeconds, row.FillWalkCPUSeconds)
	return nil
}

// list times one `eztunnel connections -o json` of the datapath at pin and
// counts the ends it printed; a failure is returned as its message.
func list(ctx context.Context, agent, pin string, extra ...string) (seconds float64, size int64, ends int, failed string) {
	cmd := sysexec.Command(ctx, agent, append([]string{"connections", "--pin-path", pin, "-o", "json"}, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, 0, err.Error()
	}
	errb := logbuf.Buffer{Limit: stderrKept}
	cmd.Stderr = &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, 0, err.Error()
	}
	cw := &countingReader{r: out}
	ends, derr := countEnds(cw)
	io.Copy(io.Discard, cw)
	seconds = time.Since(start).Seconds()
	if err := cmd.Wait(); err != nil {
		return seconds, cw.n, ends, fmt.Sprintf("%v: %s", err, tail(&errb))
	}
	if derr != nil {
		return seconds, cw.n, ends, fmt.Sprintf("output: %v", derr)
	}
	return seconds, cw.n, ends, ""
}

// countEnds counts the elements of the JSON array the listing prints,
// one end at a time.
func countEnds(rd io.Reader) (int, error) {
	dec := json.NewDecoder(rd)
	if _, err := dec.Token(); err != nil { // [
		return 0, err
	}
	n := 0
	for dec.More() {
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// rounds checks a message on every connection while accelerated (round
// 0); stops the servers, leaves a message unread on a sample of
// connections and lets the servers read again ReaderStop later (round 1);
// does the same around the uninstall: the agent stops, the uninstall
// begins, the servers read again ReaderStop after it began and the holders
// read the echoes while it drains (round 2); then
// checks a message on every connection on the kernel path (round 3). Each
// echo is waited for at most 30 s.
func (r *run) rounds(ctx context.Context, row *Row, ag *agent, servers, holders []*proc) error {
	check := func(round int) error {
		if round != 2 { // round 2's check began with the uninstall
			signalAll(holders, syscall.SIGUSR1)
		}
		agg, err := collect(ctx, holders, round)
		if err != nil {
			return err
		}
		row.Rounds = append(row.Rounds, agg)
		fmt.Fprintf(r.o.Log, "  round %d: %d connections, %d bytes back exactly, %d mismatched, %d failed (%.1f s) %s\n", round, agg.Conns, agg.Bytes, agg.Mismatches, agg.Errors, agg.Seconds, agg.FirstError)
		return nil
	}
	// Messages that wait for stopped readers: unread in the servers'
	// sockets while the datapath runs (round 1), then while it is
	// uninstalled (round 2).
	stopAndSend := func(round int) error {
		signalAll(servers, syscall.SIGSTOP)
		signalAll(holders, syscall.SIGUSR2)
		if err := waitFiles(ctx, holders, "sent-"+strconv.Itoa(round), 5*time.Minute); err != nil {
			signalAll(servers, syscall.SIGCONT)
			return err
		}
		return nil
	}
	if err := check(0); err != nil {
		return err
	}
	if err := stopAndSend(1); err != nil {
		return err
	}
	time.Sleep(r.o.ReaderStop)
	signalAll(servers, syscall.SIGCONT)
	if err := check(1); err != nil {
		return err
	}
	if err := stopAndSend(2); err != nil {
		return err
	}
	r.uninstall(ctx, row, ag, servers, holders)
	if err := check(2); err != nil {
		return err
	}
	if err := check(3); err != nil {
		return err
	}
	row.Exact = row.UninstallError == "" && row.Rounds[0].Conns == row.Conns && row.Rounds[3].Conns == row.Conns && row.Rounds[1].Conns > 0 && row.Rounds[2].Conns > 0
	for _, rd := range row.Rounds {
		row.Exact = row.Exact && rd.Mismatches == 0 && rd.Errors == 0
	}
	return nil
}

// collect waits for every holder's round file and adds them up.
func collect(ctx context.Context, holders []*proc, round int) (workload.ScaleRound, error) {
	name := fmt.Sprintf("round-%d.json", round)
	agg := workload.ScaleRound{Round: uint64(round)}
	if err := waitFiles(ctx, holders, name, 10*time.Minute); err != nil {
		return agg, err
	}
	for _, h := range holders {
		b, err := os.ReadFile(filepath.Join(h.dir, name))
		if err != nil {
			return agg, err
		}
		var one workload.ScaleRound
		if err := json.Unmarshal(b, &one); err != nil {
			return agg, fmt.Errorf("%s: %w", name, err)
		}
		agg.Conns += one.Conns
		agg.Bytes += one.Bytes
		agg.Mismatches += one.Mismatches
		agg.Errors += one.Errors
		agg.Seconds = max(agg.Seconds, one.Seconds)
		if agg.FirstError == "" {
			agg.FirstError = one.FirstError
		}
	}
	return agg, nil
}

// freePort is a free port on the loopback for the agent's metrics.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// uninstall stops the agent and times `eztunnel uninstall`; the servers
// read again ReaderStop after it began, and the holders start checking
// round 2 then. If it fails, what it left is recorded and it runs once
// more.
func (r *run) uninstall(ctx context.Context, row *Row, ag *agent, servers, holders []*proc) {
	ag.stopAgent()
	// Whatever happens, the servers read again when this returns.
	defer signalAll(servers, syscall.SIGCONT)
	checking := false
	defer func() {
		if !checking {
			signalAll(holders, syscall.SIGUSR1)
		}
	}()
	run := func(continueAfter time.Duration) (float64, string) {
		start := time.Now()
		cmd := sysexec.Command(ctx, r.o.Agent, "uninstall", "--pin-path", ag.cfg.PinRoot, "--drain-timeout", r.o.DrainTimeout.String())
		out := logbuf.Buffer{Limit: stderrKept}
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Start()
		if err == nil {
			time.Sleep(continueAfter)
			signalAll(servers, syscall.SIGCONT)
			// The holders read the echoes while it drains: an echo
			// written before the drain began is redirected to its
			// client, and the uninstall waits until that is read.
			if !checking {
				signalAll(holders, syscall.SIGUSR1)
				checking = true
			}
			err = cmd.Wait()
		}
		if err != nil {
			return time.Since(start).Seconds(), fmt.Sprintf("%v: %s", err, tail(&out))
		}
		return time.Since(start).Seconds(), ""
	}
	row.UninstallSeconds, row.UninstallError = run(r.o.ReaderStop)
	fmt.Fprintf(r.o.Log, "  uninstall: %.2f s %s\n", row.UninstallSeconds, row.UninstallError)
	if row.UninstallError == "" {
		return
	}
	row.UninstallLeft = leftBehind(ag, servers)
	fmt.Fprintf(r.o.Log, "  left behind: %s\n", row.UninstallLeft)
	var again string
	row.UninstallRerunSeconds, again = run(0)
	if again != "" {
		row.UninstallLeft += "; the rerun failed too: " + again
	}
	fmt.Fprintf(r.o.Log, "  uninstall rerun: %.2f s %s\n", row.UninstallRerunSeconds, again)
}

// leftBehind describes what a failed uninstall left: the ends still
// enrolled, by role, and the servers' scheduling states.
func leftBehind(ag *agent, servers []*proc) string {
	var b strings.Builder
	conns, err := datapath.Connections(ag.cfg)
	if err != nil {
		fmt.Fprintf(&b, "listing from the pins: %v", err)
	}
	type key struct {
		role          string
		unread, moved bool
	}
	counts := map[key]int{}
	for _, c := range conns {
		counts[key{c.Role, c.RxUnread > 0, c.Switched || c.Left}]++
	}
	for k, n := range counts {
		fmt.Fprintf(&b, "%d %s ends (rx_unread>0 %v, switched %v); ", n, k.role, k.unread, k.moved)
	}
	b.WriteString("servers:")
	for _, p := range servers {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", p.cmd.Process.Pid))
		state := "?"
		if f := strings.Fields(string(st)); len(f) > 2 {
			state = f[2]
		}
		fmt.Fprintf(&b, " %s/%s", state, wchan)
	}
	return b.String()
}
