package mesh

import (
	"math"
	"testing"

	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/lab/bench"
)

func TestParseRedisCSV(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","48780.49","0.055","0.016","0.055","0.103","0.143","0.247"
"GET","60606.06","0.043","0.016","0.047","0.063","0.111","0.207"
`
	tests, err := ParseRedisCSV(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) != 2 || tests[0].Name != "SET" || tests[0].RPS != 48780.49 || tests[1].P50Ms != 0.047 || tests[1].P99Ms != 0.111 {
		t.Errorf("%+v", tests)
	}
	if _, err := ParseRedisCSV("ERROR: connection refused\n"); err == nil {
		t.Error("garbage parsed")
	}
}

func TestParseWrk(t *testing.T) {
	out := `Running 2s test @ http://10.77.40.3:8080/index.html
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   112.50us   40.10us   2.10ms   90.00%
    Req/Sec    63.50k     2.10k   66.00k    75.00%
  Latency Distribution
     50%   105.00us
     75%   120.00us
     90%   150.00us
     99%    1.20ms
  126360 requests in 2.00s, 102.06MB read
Requests/sec:  63180.00
Transfer/sec:     51.03MB
`
	w, err := ParseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := WrkResult{Requests: 126360, Seconds: 2, RPS: 63180, AvgUs: 112.5, StdevUs: 40.1, MaxUs: 2100,
		P50Us: 105, P75Us: 120, P90Us: 150, P99Us: 1200}
	if w != want {
		t.Errorf("got %+v\nwant %+v", w, want)
	}
	w, err = ParseWrk(out + "  Socket errors: connect 1, read 2, write 0, timeout 3\n  Non-2xx or 3xx responses: 4\n")
	if err != nil || w.Errors != 10 || w.SocketErrors != 6 || w.Non2xx != 4 {
		t.Errorf("errors %v (socket %v, non-2xx %v), %v", w.Errors, w.SocketErrors, w.Non2xx, err)
	}
}

// The procfs fixture (testdata/proc) has a /proc/stat "cpu" line with
// busy 100+2+50+3+10+1 ticks, one process (pid 1234, in testdata/cgroup)
// with utime 250 + stime 75 ticks, 500 MiB used and 42 TCP memory pages.
func TestProcReaders(t *testing.T) {
	pfs, err := procfs.NewFS("testdata/proc")
	if err != nil {
		t.Fatal(err)
	}
	busy, err := bench.SystemBusy(pfs)
	if err != nil || math.Abs(busy-1.66) > 1e-9 {
		t.Errorf("busy %v, %v", busy, err)
	}
	pt := procTimes(pfs, "testdata/cgroup")
	if len(pt) != 1 || pt[1234].name != "redis server" || math.Abs(pt[1234].seconds-3.25) > 1e-9 {
		t.Errorf("proc times %+v", pt)
	}
	used, err := memUsedMB(pfs)
	if err != nil || used != 500 {
		t.Errorf("used %v, %v", used, err)
	}
	pages, err := bench.TCPMemPages(pfs)
	if err != nil || pages != 42 {
		t.Errorf("TCP mem pages %v, %v", pages, err)
	}
	d := procDelta(map[int]procTime{1: {"haproxy", 1}, 2: {"nginx", 2}, 3: {"haproxy", 1}},
		map[int]procTime{1: {"haproxy", 1.5}, 2: {"nginx", 2.25}, 3: {"haproxy", 2}, 4: {"new", 9}})
	if len(d) != 2 || d["haproxy"] != 1.5 || d["nginx"] != 0.25 {
		t.Errorf("delta %v", d)
	}
}
