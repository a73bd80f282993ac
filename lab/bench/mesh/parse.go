package mesh

import (
	"encoding/csv"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// RedisTest is one line of `redis-benchmark --csv` (the lab and the
// Kubernetes bench between pods read it).
type RedisTest struct {
	Name                string
	RPS                 float64
	AvgMs, P50Ms, P95Ms float64
	P99Ms, MinMs, MaxMs float64
}

// ParseRedisCSV reads redis-benchmark 7's --csv output:
// "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms".
func ParseRedisCSV(out string) ([]RedisTest, error) {
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("redis-benchmark csv: %w", err)
	}
	if len(recs) < 2 || len(recs[0]) < 8 || recs[0][0] != "test" {
		return nil, fmt.Errorf("redis-benchmark csv: unexpected output %q", out)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	var tests []RedisTest
	for _, r := range recs[1:] {
		num := func(name string) (float64, error) { return strconv.ParseFloat(r[col[name]], 64) }
		t := RedisTest{Name: r[0]}
		var errs [7]error
		t.RPS, errs[0] = num("rps")
		t.AvgMs, errs[1] = num("avg_latency_ms")
		t.MinMs, errs[2] = num("min_latency_ms")
		t.P50Ms, errs[3] = num("p50_latency_ms")
		t.P95Ms, errs[4] = num("p95_latency_ms")
		t.P99Ms, errs[5] = num("p99_latency_ms")
		t.MaxMs, errs[6] = num("max_latency_ms")
		for _, e := range errs {
			if e != nil {
				return nil, fmt.Errorf("redis-benchmark csv line %v: %w", r, e)
			}
		}
		tests = append(tests, t)
	}
	return tests, nil
}

// WrkResult is what `wrk --latency` prints that the lab uses.
type WrkResult struct {
	Requests            float64
	Seconds             float64
	RPS                 float64
	AvgUs, StdevUs      float64
	MaxUs               float64
	P50Us, P75Us, P90Us float64
	P99Us               float64
	Errors              float64 // socket errors and non-2xx/3xx responses
	SocketErrors        float64 // connect, read, write and timeout errors
	Non2xx              float64 // non-2xx/3xx responses
}

var (
	wrkLatency  = regexp.MustCompile(`(?m)^\s*Latency\s+(\S+)\s+(\S+)\s+(\S+)`)
	wrkPct      = regexp.MustCompile(`(?m)^\s*(50|75|90|99)%\s+(\S+)`)
	wrkRequests = regexp.MustCompile(`(?m)^\s*(\d+) requests in ([\d.]+\w+)`)
	wrkRPS      = regexp.MustCompile(`(?m)^Requests/sec:\s+([\d.]+)`)
	wrkSocket   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// ParseWrk reads the output of `wrk --latency`.
func ParseWrk(out string) (WrkResult, error) {
	var r WrkResult
	m := wrkLatency.FindStringSubmatch(out)
	rq := wrkRequests.FindStringSubmatch(out)
	rps := wrkRPS.FindStringSubmatch(out)
	if m == nil || rq == nil || rps == nil {
		return r, fmt.Errorf("wrk: unexpected output %q", out)
	}
	var err error
	var errs []error
	dur := func(s string) float64 {
		v, e := parseWrkDuration(s)
		errs = append(errs, e)
		return v
	}
	r.AvgUs, r.StdevUs, r.MaxUs = dur(m[1]), dur(m[2]), dur(m[3])
	for _, p := range wrkPct.FindAllStringSubmatch(out, -1) {
		v := dur(p[2])
		switch p[1] {
		case "50":
			r.P50Us = v
		case "75":
			r.P75Us = v
		case "90":
			r.P90Us = v
		case "99":
			r.P99Us = v
		}
	}
	r.Requests, _ = strconv.ParseFloat(rq[1], 64)
	r.Seconds = dur(rq[2]) / 1e6
	if r.RPS, err = strconv.ParseFloat(rps[1], 64); err != nil {
		return r, err
	}
	if s := wrkSocket.FindStringSubmatch(out); s != nil {
		for _, v := range s[1:] {
			n, _ := strconv.ParseFloat(v, 64)
			r.SocketErrors += n
		}
	}
	if s := wrkNon2xx.FindStringSubmatch(out); s != nil {
		r.Non2xx, _ = strconv.ParseFloat(s[1], 64)
	}
	r.Errors = r.SocketErrors + r.Non2xx
	for _, e := range errs {
		if e != nil {
			return r, e
		}
	}
	return r, nil
}

// parseWrkDuration reads wrk's "123.45us", "1.20ms", "2.00s", "1.00m" in
// microseconds.
func parseWrkDuration(s string) (float64, error) {
	for _, u := range []struct {
		suffix string
		us     float64
	}{{"us", 1}, {"ms", 1e3}, {"s", 1e6}, {"m", 60e6}, {"h", 3600e6}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("wrk duration %q: %w", s, err)
			}
			return f * u.us, nil
		}
	}
	return 0, fmt.Errorf("wrk duration %q: unknown unit", s)
}
