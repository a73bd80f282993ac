package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/meshlab"
)

// scale of a workload run: a full measurement or the short warm-up.
type scale struct {
	pacedN, pingN, transferMiB, redisN int
	httpDuration                       time.Duration
}

func (o LabOptions) scale() scale {
	return scale{o.PacedN, o.PingN, o.TransferMiB, o.RedisN, o.HTTPDuration}
}

// warmupScale is one short pass of every workload before a mesh's first
// recorded run: caches, ARP, proxies' first connections.
var warmupScale = scale{pacedN: 3, pingN: 500, transferMiB: 16, redisN: 2000, httpDuration: time.Second}

// clientResult is what a client process reported.
type clientResult struct {
	out     []byte
	seconds float64 // wall time
	cpu     float64 // the client's own user+system seconds (rusage)
	name    string
}

// runClient runs argv in the client pod and returns its stdout.
func runClient(ctx context.Context, n *meshlab.Node, timeout time.Duration, argv ...string) (clientResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := n.Cmd(ctx, n.Client, argv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := n.Client.Run(cmd)
	res := clientResult{out: out.Bytes(), seconds: time.Since(start).Seconds(), name: shortName(argv[0])}
	if cmd.ProcessState != nil {
		res.cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	if err != nil {
		return res, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(errb.String()+" "+out.String()))
	}
	return res, nil
}

func shortName(path string) string {
	return path[strings.LastIndexByte(path, '/')+1:]
}

// workloadFunc runs one workload and fills the run's workload fields.
type workloadFunc func(ctx context.Context, n *meshlab.Node, o LabOptions, s scale, r *LabRun) (clientResult, error)

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
	return func(ctx context.Context, n *meshlab.Node, o LabOptions, s scale, r *LabRun) (clientResult, error) {
		count, warm := s.pingN, max(s.pingN/20, 10)
		argv := []string{o.Exe, "workload", "pingpong", "--addr", n.Addr(meshlab.PortEcho), "--size", "24", "--raw"}
		timeout := 3 * time.Minute
		if paced {
			count, warm = s.pacedN, 2
			argv = append(argv, "--interval", o.Interval.String())
			timeout += time.Duration(count+warm) * o.Interval
		}
		argv = append(argv, "--n", strconv.Itoa(count), "--warmup", strconv.Itoa(warm))
		res, err := runClient(ctx, n, timeout, argv...)
		if err != nil {
			return res, err
		}
		var out struct {
			Samples []float64 `json:"samples_us"`
		}
		if err := json.Unmarshal(res.out, &out); err != nil || len(out.Samples) != count {
			return res, fmt.Errorf("pingpong output (%d samples, want %d): %v", len(out.Samples), count, err)
		}
		r.Samples = out.Samples
		r.Latency = stats.Summarize(out.Samples)
		r.Ops = float64(count)
		if sum := r.Latency.Mean * float64(count); sum > 0 {
			r.Rate = float64(count) / (sum / 1e6) // back to back: requests per second of round-trip time
		}
		return res, nil
	}
}

// fileTransfer sends transferMiB over one fresh connection; FCT is from
// connect until the server confirmed the last byte (`workload stream`
// --no-check: bytes neither generated nor checked, the e2e tests prove
// byte-exactness).
func fileTransfer(ctx context.Context, n *meshlab.Node, o LabOptions, s scale, r *LabRun) (clientResult, error) {
	bytes := uint64(s.transferMiB) << 20
	res, err := runClient(ctx, n, 5*time.Minute, o.Exe, "workload", "stream", "--addr", n.Addr(meshlab.PortStream),
		"--conns", "1", "--no-check", "--up", strconv.FormatUint(bytes, 10), "--down", "0", "--chunk", "262144")
	if err != nil {
		return res, err
	}
	var out struct {
		Seconds float64 `json:"seconds"`
	}
	if err := json.Unmarshal(res.out, &out); err != nil || out.Seconds <= 0 {
		return res, fmt.Errorf("stream output %q: %v", res.out, err)
	}
	r.FCT = out.Seconds
	r.Ops = float64(s.transferMiB)
	r.Rate = float64(s.transferMiB) / out.Seconds
	return res, nil
}

// redisBench runs redis-benchmark SET and GET with several clients.
// OPS is over both tests (total requests / total time); latencies are the
// mean of the two tests' figures.
func redisBench(ctx context.Context, n *meshlab.Node, o LabOptions, s scale, r *LabRun) (clientResult, error) {
	res, err := runClient(ctx, n, 5*time.Minute, "redis-benchmark", "-h", n.Server.IPv4.String(),
		"-p", strconv.Itoa(meshlab.PortRedis), "-c", strconv.Itoa(o.RedisClients), "-n", strconv.Itoa(s.redisN),
		"-t", "set,get", "--csv")
	if err != nil {
		return res, err
	}
	tests, err := parseRedisCSV(string(res.out))
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
func httpBench(ctx context.Context, n *meshlab.Node, o LabOptions, s scale, r *LabRun) (clientResult, error) {
	url := fmt.Sprintf("http://%s/index.html", n.Addr(meshlab.PortHTTP))
	res, err := runClient(ctx, n, s.httpDuration+time.Minute, "wrk", "-t1", "-c", strconv.Itoa(o.HTTPConns),
		"-d", fmt.Sprintf("%ds", int(s.httpDuration.Seconds())), "--latency", url)
	if err != nil {
		return res, err
	}
	w, err := parseWrk(string(res.out))
	if err != nil {
		return res, err
	}
	if w.Errors > 0 || w.Requests == 0 {
		return res, fmt.Errorf("wrk: %v requests, %v errors: %s", w.Requests, w.Errors, res.out)
	}
	r.Latency = stats.Summary{N: int(w.Requests), P50: w.P50Us, P75: w.P75Us, P99: w.P99Us,
		Mean: w.AvgUs, StdDev: w.StdevUs, Max: w.MaxUs}
	r.Extra = map[string]float64{"p90_us": w.P90Us}
	r.Ops, r.Rate = w.Requests, w.RPS
	return res, nil
}
