package tracepaths

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/internal/tracer"
	"github.com/eztunnel/eztunnel/lab/bench"
)

// Directions of a request/response exchange.
const (
	Request  = "request"
	Response = "response"
)

// Pod pairs.
const (
	SameNode  = "same-node"
	CrossNode = "cross-node"
)

// Namespaces of a lifetime, in path order: the fields of tracer.Parts.
const (
	nsPodOut = iota
	nsHost
	nsWire
	nsHost2
	nsPodIn
	nsCount
)

// Key names one table row: a datapath, a protocol, a pod pair and a direction.
type Key struct {
	Path     string // SameNode or CrossNode
	Proto    string // "tcp" or "udp"
	Dir      string // Request or Response
	Datapath string
}

// lifetime is what the tables keep of one traced packet lifetime.
type lifetime struct {
	src, dst     netip.Addr
	sport, dport uint16
	complete     bool // seen in the sending pod and read by the application
	parts        [nsCount]uint64
	e2e          uint64 // ns from the first stage to the application's read
	path         string // the stages it went through
}

// lifetimeOf keeps what the tables need of r. A lifetime is complete when
// it has a stage in the sending pod and was queued to the receiving socket
// (sock, the thesis' "received by socket"): pure ACKs, lifetimes split by
// the kernel (a new sk_buff) and the first half of split ones are not. Its
// parts stop at the socket (the application's read and the free after it
// are not counted), so they add up to e2e.
func lifetimeOf(r *tracer.Record) lifetime {
	lt := lifetime{src: r.Src, dst: r.Dst, sport: r.SPort, dport: r.DPort}
	st := r.Stages()
	if len(st) == 0 {
		return lt
	}
	names := make([]string, 0, len(st))
	for _, s := range st {
		if s < tracer.StageCopy {
			names = append(names, s.String())
		}
	}
	lt.path = strings.Join(names, " ")
	if st[0] >= tracer.StageHostRX || r.TS[tracer.StageSock] == 0 {
		return lt
	}
	c := *r
	c.TS[tracer.StageCopy], c.TS[tracer.StageFree] = 0, 0
	p := c.Parts()
	lt.complete = true
	lt.parts = [nsCount]uint64{p.PodOut, p.Host, p.Wire, p.Host2, p.PodIn}
	lt.e2e = r.TS[tracer.StageSock] - r.TS[st[0]]
	return lt
}

// direction says whether lt went from client to server (server:port is the
// server's socket) or back, or neither.
func (lt lifetime) direction(server netip.Addr, port uint16) (string, bool) {
	switch {
	case lt.dst == server && lt.dport == port:
		return Request, true
	case lt.src == server && lt.sport == port:
		return Response, true
	}
	return "", false
}

// cell collects one row's lifetimes over all rounds.
type cell struct {
	lifetimes int                // of this direction
	parts     [nsCount][]float64 // µs, complete lifetimes
	e2e       []float64          // µs, complete lifetimes
	roundE2E  map[int][]float64  // e2e by round, for the per-round change
	paths     map[string]int     // complete lifetimes by stages
}

// run is what one workload run added besides the trace: the application's
// round-trip time and the agents' counters.
type run struct {
	rttP50   float64
	bypassed float64
	sockSend uint64 // sendmsg calls the tracer counted on the flow
	// lifetimes of this run, request [0] and response [1]
	complete, all [2]int
}

// Results are every row of every table.
type Results struct {
	Rounds int
	cells  map[Key]*cell
	runs   map[Key][]run // Dir is ""
}

// NewResults is empty.
func NewResults() *Results {
	return &Results{cells: map[Key]*cell{}, runs: map[Key][]run{}}
}

func (r *Results) cell(k Key) *cell {
	c, ok := r.cells[k]
	if !ok {
		c = &cell{roundE2E: map[int][]float64{}, paths: map[string]int{}}
		r.cells[k] = c
	}
	return c
}

// Add accounts one lifetime of the run k (Dir empty) in round; lifetimes
// neither to nor from server:port are ignored.
func (r *Results) Add(k Key, round int, server netip.Addr, port uint16, lt lifetime) {
	dir, ok := lt.direction(server, port)
	if !ok {
		return
	}
	k.Dir = dir
	c := r.cell(k)
	c.lifetimes++
	if !lt.complete {
		return
	}
	for i, v := range lt.parts {
		c.parts[i] = append(c.parts[i], float64(v)/1e3)
	}
	e := float64(lt.e2e) / 1e3
	c.e2e = append(c.e2e, e)
	c.roundE2E[round] = append(c.roundE2E[round], e)
	c.paths[lt.path]++
}

// AddRun records one workload run of k (Dir empty).
func (r *Results) AddRun(k Key, rn run) {
	k.Dir = ""
	r.runs[k] = append(r.runs[k], rn)
}

// nsColumns names the namespaces of a pod pair's table, in path order, and
// which parts they are; the names are for the request (client to server).
func nsColumns(path, dir string) (names []string, parts []int) {
	client, server, n1, n2 := "client pod", "server pod", "node 1", "node 2"
	if dir == Response {
		client, server, n1, n2 = server, client, n2, n1
	}
	if path == SameNode {
		return []string{client, "node", server}, []int{nsPodOut, nsHost, nsPodIn}
	}
	return []string{client, n1, "wire", n2, server}, []int{nsPodOut, nsHost, nsWire, nsHost2, nsPodIn}
}

// Write prints one table per pod pair and direction: for each datapath and
// protocol the time spent in each namespace and end to end, median / PDV
// (P99 - P1) in µs over every complete lifetime of every round; the change
// of the end-to-end median against the bridge (median of the per-round
// changes); the application's round-trip p50 (median over runs); and the
// lifetimes (complete / all of that direction). Then the stages of the most
// common complete path of each row, up to the socket.
func (r *Results) Write(w io.Writer, datapaths, protos []string) {
	var pathLines []string
	for _, path := range []string{SameNode, CrossNode} {
		for _, dir := range []string{Request, Response} {
			names, parts := nsColumns(path, dir)
			if !r.has(path, dir) {
				continue
			}
			fmt.Fprintf(w, "\n%s, %s (%s); µs, median / PDV\n\n", path, dir, strings.Join(names, " → "))
			header := append([]string{"datapath, protocol"}, names...)
			header = append(header, "end to end", "e2e median vs bridge", "app RTT p50", "lifetimes complete/all")
			var rows [][]string
			for _, proto := range protos {
				for _, dp := range datapaths {
					k := Key{Path: path, Proto: proto, Dir: dir, Datapath: dp}
					c := r.cells[k]
					row := []string{dp + ", " + strings.ToUpper(proto)}
					if c == nil {
						c = &cell{}
					}
					if r.socketToSocket(k, c) {
						// The socket shortcut: the data never became an
						// sk_buff; the few lifetimes are the handshake and
						// the close, not the request/response.
						for range parts {
							row = append(row, "-")
						}
						row = append(row, "socket to socket", "", r.rtt(k), fmt.Sprintf("%d/%d", len(c.e2e), c.lifetimes))
						rows = append(rows, row)
						continue
					}
					for _, p := range parts {
						row = append(row, medPDV(c.parts[p]))
					}
					row = append(row, medPDV(c.e2e))
					row = append(row, r.change(k), r.rtt(k), fmt.Sprintf("%d/%d", len(c.e2e), c.lifetimes))
					rows = append(rows, row)
					if top, n := topPath(c.paths); n > 0 {
						pathLines = append(pathLines, fmt.Sprintf("%s %s %s, %s: %d%% of %d: %s", path, dir, strings.ToUpper(proto), dp,
							int(math.Round(100*float64(n)/float64(len(c.e2e)))), len(c.e2e), top))
					}
				}
			}
			var b strings.Builder
			bench.WriteTable(&b, header, rows)
			io.WriteString(w, b.String())
		}
	}
	if len(pathLines) > 0 {
		fmt.Fprintf(w, "\nmost common path of the complete lifetimes:\n")
		for _, l := range pathLines {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	fmt.Fprintf(w, "\nper run (median over %d round(s)): bypassed packets (agents' counters, both nodes) and sendmsg calls on the flow (tracer)\n", r.Rounds)
	for _, path := range []string{SameNode, CrossNode} {
		for _, proto := range protos {
			for _, dp := range datapaths {
				rs := r.runs[Key{Path: path, Proto: proto, Datapath: dp}]
				if len(rs) == 0 {
					continue
				}
				var by, ss []float64
				for _, x := range rs {
					by, ss = append(by, x.bypassed), append(ss, float64(x.sockSend))
				}
				fmt.Fprintf(w, "  %s %s, %s: bypassed %.0f, sendmsg %.0f\n", path, strings.ToUpper(proto), dp, median(by), median(ss))
			}
		}
	}
}

// socketToSocket: the runs of k sent data (sendmsg calls) but less than 1%
// of them became complete lifetimes: the socket shortcut carried them.
func (r *Results) socketToSocket(k Key, c *cell) bool {
	k.Dir = ""
	var sent uint64
	for _, x := range r.runs[k] {
		sent += x.sockSend
	}
	return sent > 0 && uint64(len(c.e2e))*100 < sent
}

func (r *Results) has(path, dir string) bool {
	for k := range r.cells {
		if k.Path == path && k.Dir == dir {
			return true
		}
	}
	return false
}

// medPDV is "median / PDV", or "-" without samples.
func medPDV(xs []float64) string {
	if len(xs) == 0 {
		return "-"
	}
	s := stats.Summarize(xs)
	return fmt.Sprintf("%.2f / %.2f", s.P50, s.PDV)
}

// change is the median over rounds of (median e2e / bridge's median e2e in
// the same round - 1), in percent.
func (r *Results) change(k Key) string {
	b := k
	b.Datapath = bridgeName
	if k.Datapath == bridgeName {
		return ""
	}
	bc, c := r.cells[b], r.cells[k]
	if bc == nil || c == nil || r.socketToSocket(k, c) {
		return "-"
	}
	var ch []float64
	for round, xs := range c.roundE2E {
		if bs := bc.roundE2E[round]; len(bs) > 0 && len(xs) > 0 {
			ch = append(ch, (median(xs)/median(bs)-1)*100)
		}
	}
	if len(ch) == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.0f%%", median(ch))
}

// rtt is the median over runs of the application's RTT p50, in µs.
func (r *Results) rtt(k Key) string {
	k.Dir = ""
	rs := r.runs[k]
	if len(rs) == 0 {
		return "-"
	}
	var xs []float64
	for _, x := range rs {
		xs = append(xs, x.rttP50)
	}
	return fmt.Sprintf("%.1f", median(xs))
}

// topPath is the most common path and its count (ties: the shorter name).
func topPath(paths map[string]int) (string, int) {
	var keys []string
	for p := range paths {
		keys = append(keys, p)
	}
	sort.Slice(keys, func(i, j int) bool {
		if paths[keys[i]] != paths[keys[j]] {
			return paths[keys[i]] > paths[keys[j]]
		}
		return keys[i] < keys[j]
	})
	if len(keys) == 0 {
		return "", 0
	}
	return keys[0], paths[keys[0]]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	return stats.Quantile(s, 0.5)
}
