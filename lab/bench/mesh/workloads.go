package mesh

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/meshlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// scale of a workload run: a full measurement or the short warm-up.
type scale struct {
	pacedN, pingN, transferMiB, redisN int
	httpDuration                       time.Duration
}

func (o Options) scale() scale {
	return scale{o.PacedN, o.PingN, o.TransferMiB, o.RedisN, o.HTTPDuration}
}

// warmupScale is one short pass of every workload before a mesh's first
// recorded run: caches, ARP, proxies' first connections.
var warmupScale = scale{pacedN: 3, pingN: 100, transferMiB: 16, redisN: 2000, httpDuration: time.Second}

// clientResult is what a client process cost, by its name.
type clientResult struct {
	workload.Usage
	name string
}

// runClient runs argv in the client pod and returns its stdout.
func (m *meter) runClient(timeout time.Duration, argv ...string) ([]byte, clientResult, error) {
	out, u, err := m.wl.Run(m.ctx, m.node.Client, timeout, argv...)
	return out, clientResult{u, filepath.Base(argv[0])}, err
}

// workloadFunc runs one workload and fills the run's workload fields.
type workloadFunc func(m *meter, s scale, r *Run) (clientResult, error)

var workloadFuncs = map[string]workloadFunc{
	WPaced:    pingEcho(true),
	WB2B:      pingEcho(false),
	WTransfer: fileTransfer,
	WRedis:    redisBench,
	WHTTP:     httpBench,
}

// pingEcho sends 24-byte messages carrying their send timestamp to the
// echo server with the raw blocking client of `workload pingpong`.
func pingEcho(paced bool) workloadFunc {
	return func(m *meter, s scale, r *Run) (clientResult, error) {
		n := m.node
		pp := workload.PingPongArgs{Addr: n.Addr(meshlab.PortEcho), Size: 24, N: s.pingN, Warmup: max(s.pingN/20, 10), Raw: true, Conns: m.o.PingConns}
		if paced {
			pp.N, pp.Warmup, pp.Interval, pp.Conns = s.pacedN, 2, m.o.Interval, 1
		}
		out, u, err := m.wl.PingPong(m.ctx, n.Client, pp)
		res := clientResult{u, "eztunnel-lab"}
		if err != nil {
			return res, err
		}
		r.Samples = out.Samples
		r.Latency = stats.Summarize(out.Samples)
		r.Ops = float64(len(out.Samples))
		if sum := r.Latency.Mean * r.Ops; sum > 0 {
			r.Rate = r.Ops / (sum / 1e6) // back to back: requests per second of round-trip time
		}
		return res, nil
	}
}

// fileTransfer sends transferMiB over one fresh connection; FCT is from
// connect until the server confirmed the last byte (`workload stream`
// --no-check: bytes neither generated nor checked, the e2e tests prove
// byte-exactness).
func fileTransfer(m *meter, s scale, r *Run) (clientResult, error) {
	secs, u, err := m.wl.Upload(m.ctx, m.node.Client, m.node.Addr(meshlab.PortStream), uint64(s.transferMiB)<<20, 262144)
	res := clientResult{u, "eztunnel-lab"}
	if err != nil {
		return res, err
	}
	r.FCT = secs
	r.Ops = float64(s.transferMiB)
	r.Rate = float64(s.transferMiB) / secs
	return res, nil
}

// redisBench runs redis-benchmark SET and GET with several clients.
// OPS is over both tests (total requests / total time); latencies are the
// mean of the two tests' figures.
func redisBench(m *meter, s scale, r *Run) (clientResult, error) {
	n, o := m.node, m.o
	out, res, err := m.runClient(5*time.Minute, "redis-benchmark", "-h", n.Server.IPv4.String(),
		"-p", strconv.Itoa(meshlab.PortRedis), "-c", strconv.Itoa(o.RedisClients), "-n", strconv.Itoa(s.redisN),
		"-t", "set,get", "--csv")
	if err != nil {
		return res, err
	}
	tests, err := ParseRedisCSV(string(out))
	if err != nil {
		return res, err
	}
	r.Extra = map[string]float64{}
	var secs float64
	for _, t := range tests {
		if t.RPS <= 0 {
			return res, fmt.Errorf("redis-benchmark %s: %v ops/s", t.Name, t.RPS)
		}
		secs += float64(s.redisN) / t.RPS
		k := strings.ToLower(t.Name)
		r.Extra[k+"_ops"] = t.RPS
		r.Extra[k+"_p95_us"] = t.P95Ms * 1000
		r.Latency.Mean += t.AvgMs * 1000 / float64(len(tests))
		r.Latency.P50 += t.P50Ms * 1000 / float64(len(tests))
		r.Latency.P99 += t.P99Ms * 1000 / float64(len(tests))
	}
	r.Ops = float64(s.redisN * len(tests))
	r.Rate = r.Ops / secs
	r.Latency.N = int(r.Ops)
	return res, nil
}

// httpBench runs wrk against nginx's static page.
func httpBench(m *meter, s scale, r *Run) (clientResult, error) {
	url := fmt.Sprintf("http://%s/index.html", m.node.Addr(meshlab.PortHTTP))
	o := m.o
	out, res, err := m.runClient(s.httpDuration+time.Minute, "wrk", "-t1", "-c", strconv.Itoa(o.HTTPConns),
		"-d", fmt.Sprintf("%ds", int(s.httpDuration.Seconds())), "--latency", url)
	if err != nil {
		return res, err
	}
	w, err := ParseWrk(string(out))
	if err != nil {
		return res, err
	}
	if w.Errors > 0 || w.Requests == 0 {
		return res, fmt.Errorf("wrk: %v requests, %v errors: %s", w.Requests, w.Errors, out)
	}
	r.Latency = stats.Summary{N: int(w.Requests), P50: w.P50Us, P75: w.P75Us, P99: w.P99Us,
		Mean: w.AvgUs, StdDev: w.StdevUs, Max: w.MaxUs}
	r.Extra = map[string]float64{"p90_us": w.P90Us}
	r.Ops, r.Rate = w.Requests, w.RPS
	return res, nil
}
