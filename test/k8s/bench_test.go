//go:build k8s

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/internal/toolbin"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/bench/mesh"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// What one round of BenchmarkPods measures in each mode.
const (
	benchNS      = "ez-bench"
	benchRounds  = 5     // rounds of four runs (bench.QuadOrder): an A/A pair of baselines and an A/B pair
	pingN        = 20000 // back-to-back 24-byte round trips per round, one connection
	pingWarmup   = 1000
	redisN       = 100000 // requests per redis-benchmark test (SET, GET) per round
	redisClients = 8
	redisImage   = "registry.local/eztunnel/redis:1"
	clientCPU    = 0 // the client pods' cpuset
	serverCPU    = 1 // the server pods' cpuset
)

// BenchmarkPods measures pod-to-pod ping-echo and redis with the namespace
// not selected (baseline) and selected (eztunnel), interleaved in one run,
// and prints a Markdown table of per-mode medians and eztunnel/baseline
// ratios. Run once: `make bench-k8s` (-benchtime 1x; b.N is not used).
func BenchmarkPods(b *testing.B) {
	if runtime.NumCPU() < 2 {
		b.Fatalf("the bench pins clients to CPU %d and servers to CPU %d: %d CPUs here", clientCPU, serverCPU, runtime.NumCPU())
	}
	redisTar := buildRedisImage(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cl.ImportImage(ctx, redisTar); err != nil {
		b.Fatal(err)
	}
	inst := newInstaller(b)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cl.Kubectl(ctx, "delete", "namespace", agentNS, "--ignore-not-found", "--wait=true", "--timeout=90s")
	})
	inst.install(b, agentTag)

	a := newApp(b, benchNS, nil) // lab server (echo on 7001) and client pods
	apply(b, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: redis, namespace: %[1]s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: redis, image: %[2]s, imagePullPolicy: Never, args: [--port, "6379", --bind, 0.0.0.0, --protected-mode, "no", --save, "", --appendonly, "no"]}
---
apiVersion: v1
kind: Pod
metadata: {name: redis-client, namespace: %[1]s}
spec:
  terminationGracePeriodSeconds: 1
  containers: # idles; redis-benchmark runs in it with kubectl exec
  - {name: redis, image: %[2]s, imagePullPolicy: Never, args: [--port, "6380", --bind, 127.0.0.1, --save, "", --appendonly, "no"]}
`, benchNS, redisImage))
	kubectl(b, "-n", benchNS, "wait", "--for=condition=Ready", "pod/redis", "pod/redis-client", "--timeout=120s")
	redisIP := podIP(b, benchNS, "redis")

	// Placement: each pod's cpuset (cgroup v1, as the CPU manager's static
	// policy would set it); processes exec'd into a container join it.
	place := map[string]int{"client": clientCPU, "redis-client": clientCPU, "server": serverCPU, "redis": serverCPU}
	var placed []string
	for _, pod := range []string{"client", "redis-client", "server", "redis"} {
		placed = append(placed, fmt.Sprintf("%s on CPU %s", pod, pinPod(b, benchNS, pod, place[pod])))
	}
	b.Logf("placement: %s; the agent and the cluster's daemons unpinned", strings.Join(placed, ", "))

	pingArgs := func(n, warmup int) []string {
		return []string{"-n", benchNS, "exec", "client", "--", "/eztunnel-lab", "workload", "pingpong",
			"--addr", a.serverIP + ":7001", "--size", "24", "--n", strconv.Itoa(n), "--warmup", strconv.Itoa(warmup)}
	}
	redisArgs := func(n int) []string {
		return []string{"-n", benchNS, "exec", "redis-client", "--", "/usr/bin/redis-benchmark", "-h", redisIP, "-p", "6379",
			"-c", strconv.Itoa(redisClients), "-n", strconv.Itoa(n), "-t", "set,get", "--csv"}
	}
	// Warm-up (caches, conntrack, ARP), not recorded.
	kubectl(b, pingArgs(1000, 100)...)
	kubectl(b, redisArgs(5000)...)

	load0 := loadAvg()
	var runs []podRun
	selected := false
	for round := 1; round <= benchRounds; round++ {
		for _, side := range bench.QuadOrder(round - 1) {
			on := side == bench.SideB
			if on != selected {
				setSelected(b, a, on)
				selected = on
			}
			r := podRun{round: round, side: side, values: map[string]float64{}}

			p0 := pairs(b)
			var pp workload.PingPongResult
			if out := kubectl(b, pingArgs(pingN, pingWarmup)...); json.Unmarshal([]byte(out), &pp) != nil || pp.Micros.N != pingN {
				b.Fatalf("pingpong: %q", out)
			}
			p1 := pairs(b)
			r.values[mPingP50], r.values[mPingP99] = pp.Micros.P50, pp.Micros.P99
			r.pingPairs = p1 - p0

			tests, err := mesh.ParseRedisCSV(kubectl(b, redisArgs(redisN)...))
			if err != nil {
				b.Fatal(err)
			}
			r.redisPairs = pairs(b) - p1
			for _, t := range tests {
				k := strings.ToLower(t.Name)
				r.values["redis "+k+" rps"] = t.RPS
				r.values["redis "+k+" p50"] = t.P50Ms * 1000
			}
			b.Logf("round %d %s: ping-echo p50 %.1f us p99 %.1f us (pairs %v); redis %s (pairs %v)", round, sideName(side),
				pp.Micros.P50, pp.Micros.P99, r.pingPairs, redisLine(tests), r.redisPairs)
			// The modes are what they claim: the shortcut carried every
			// selected run's connections and none of the baseline's.
			if on && (r.pingPairs < 1 || r.redisPairs < redisClients) || !on && (r.pingPairs != 0 || r.redisPairs != 0) {
				b.Fatalf("round %d %s: %v ping-echo and %v redis connections on the shortcut", round, sideName(side), r.pingPairs, r.redisPairs)
			}
			runs = append(runs, r)
		}
	}
	setSelected(b, a, false)
	fmt.Print(podTable(runs, strings.Join(placed, ", "), load0+" -> "+loadAvg()))
}

const (
	mPingP50 = "ping-echo RTT p50 (us)"
	mPingP99 = "ping-echo RTT p99 (us)"
)

// podRun is one run of a round: its side (bench.SideB: the namespace
// selected, eztunnel; the others baseline).
type podRun struct {
	round                 int
	side                  bench.Side
	values                map[string]float64
	pingPairs, redisPairs float64
}

func sideName(s bench.Side) string {
	return map[bench.Side]string{bench.SideAA1: "baseline (A/A 1)", bench.SideAA2: "baseline (A/A 2)", bench.SideA: "baseline", bench.SideB: "eztunnel"}[s]
}

func redisLine(tests []mesh.RedisTest) string {
	var parts []string
	for _, t := range tests {
		parts = append(parts, fmt.Sprintf("%s %.0f req/s p50 %.0f us", t.Name, t.RPS, t.P50Ms*1000))
	}
	return strings.Join(parts, ", ")
}

// podTable: per metric the median over rounds of the A/B pair's baseline
// and eztunnel runs, the change from baseline to eztunnel (the median of
// the per-round paired differences, 100 * (B - A) / A, with its 95%
// bootstrap interval) and the same for the A/A pair of baselines, which
// must hold 0 within ±bench.AAMaxHalfWidth for the change to be judged.
func podTable(runs []podRun, placement, load string) string {
	metrics := []struct {
		name   string
		digits int
	}{{mPingP50, 1}, {mPingP99, 1}, {"redis set rps", 0}, {"redis set p50", 0}, {"redis get rps", 0}, {"redis get p50", 0}}
	label := map[string]string{"redis set rps": "redis SET (requests/s)", "redis set p50": "redis SET p50 (us)",
		"redis get rps": "redis GET (requests/s)", "redis get p50": "redis GET p50 (us)"}
	var rows [][]string
	for _, m := range metrics {
		side := func(s bench.Side) []float64 {
			byRound := map[int]float64{}
			for _, r := range runs {
				if r.side == s {
					byRound[r.round] = r.values[m.name]
				}
			}
			var out []float64
			for round := 1; round <= benchRounds; round++ {
				if v, ok := byRound[round]; ok {
					out = append(out, v)
				}
			}
			return out
		}
		base, ez := side(bench.SideA), side(bench.SideB)
		ab, aa := bench.TryPaired(base, ez, benchSeed), bench.TryPaired(side(bench.SideAA1), side(bench.SideAA2), benchSeed)
		name := m.name
		if l, ok := label[name]; ok {
			name = l
		}
		rows = append(rows, []string{name, bench.Num(median(base), m.digits), bench.Num(median(ez), m.digits),
			ab.Cell(), aa.Cell(), bench.JudgedCell(aa)})
	}
	var pp, rp []string
	for _, r := range runs {
		if r.side == bench.SideB {
			pp = append(pp, strconv.FormatFloat(r.pingPairs, 'f', 0, 64))
			rp = append(rp, strconv.FormatFloat(r.redisPairs, 'f', 0, 64))
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\neztunnel bench between pods (%s, kernel %s, %d CPUs): %d rounds of four runs (an A/A pair of baselines, an A/B pair of baseline and eztunnel; in bench.QuadOrder's order, which cycles over four rounds)\n"+
		"ping-echo: %d x 24 B back to back on one connection per run; redis: redis-benchmark -c %d -n %d -t set,get\n"+
		"placement: %s; machine load average (1 min) before -> after: %s (the VM is shared)\n"+
		"baseline, eztunnel: median over rounds; change: median of the per-round paired differences 100 x (eztunnel - baseline) / baseline, with its 95%% bootstrap interval; "+
		"A/A: the same for the two baseline runs of each round; judged: yes when the A/A holds 0 within ±%.0f%% (else the change is not resolved to that precision: with %d pairs the intervals are coarse)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), kernelRelease(), runtime.NumCPU(), benchRounds, pingN, redisClients, redisN, placement, load,
		bench.AAMaxHalfWidth, benchRounds)
	bench.WriteTable(&sb, []string{"metric", "baseline", "eztunnel", "change [95% CI]", "A/A [95% CI]", "judged"}, rows)
	fmt.Fprintf(&sb, "\nconnections on the shortcut per eztunnel run (eztunnel_pairs_total): ping-echo %s; redis %s; baseline runs: 0\n",
		strings.Join(pp, ", "), strings.Join(rp, ", "))
	return sb.String()
}

// benchSeed seeds the bootstrap, so a table renders alike from its runs.
const benchSeed = 37

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return stats.Summarize(xs).P50
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// setSelected labels (or unlabels) the bench namespace and waits until a
// probe connection takes (or does not take) the shortcut.
func setSelected(t testing.TB, a *app, on bool) {
	t.Helper()
	if on {
		kubectl(t, "label", "namespace", a.ns, labelKey+"=enabled", "--overwrite")
	} else {
		kubectl(t, "label", "namespace", a.ns, labelKey+"-")
	}
	waitPolicy(t, a, on)
}

// pinPod sets the cpuset of a pod and its containers to cpu (cgroup v1
// cpuset hierarchy; the kubelet's none CPU-manager policy leaves it alone)
// and returns the CPU list its processes are allowed now.
func pinPod(t testing.TB, ns, pod string, cpu int) string {
	t.Helper()
	root := cpusetMount(t)
	uid := strings.TrimSpace(kubectl(t, "-n", ns, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}"))
	var dir string
	for _, pat := range []string{"kubepods/*/pod" + uid, "kubepods/pod" + uid} {
		if m, _ := filepath.Glob(filepath.Join(root, pat)); len(m) == 1 {
			dir = m[0]
		}
	}
	if dir == "" {
		t.Fatalf("pod %s/%s: no cpuset cgroup pod%s under %s/kubepods", ns, pod, uid, root)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var subs []string
	for _, e := range ents {
		if e.IsDir() {
			subs = append(subs, filepath.Join(dir, e.Name()))
		}
	}
	c := strconv.Itoa(cpu)
	// Children first: a child's cpus must stay within its parent's.
	for _, d := range append(subs, dir) {
		if err := os.WriteFile(filepath.Join(d, "cpuset.cpus"), []byte(c), 0o644); err != nil {
			t.Fatalf("pin %s/%s to CPU %d: %v", ns, pod, cpu, err)
		}
	}
	var allowed []string
	for _, d := range subs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, pid := range strings.Fields(string(b)) {
			st, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
					allowed = append(allowed, strings.TrimSpace(v))
				}
			}
		}
	}
	slices.Sort(allowed)
	allowed = slices.Compact(allowed)
	if len(allowed) != 1 || allowed[0] != c {
		t.Fatalf("pod %s/%s pinned to CPU %d: its processes may run on %v", ns, pod, cpu, allowed)
	}
	return allowed[0]
}

// cpusetMount is the cgroup v1 hierarchy with the cpuset controller.
func cpusetMount(t testing.TB) string {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[2] == "cgroup" && slices.Contains(strings.Split(f[3], ","), "cpuset") {
			return f[1]
		}
	}
	t.Fatal("no cgroup v1 cpuset hierarchy mounted: the bench cannot pin the pods")
	return ""
}

// buildRedisImage writes an image with Debian's redis-server and
// redis-benchmark and the shared libraries they load (ldd), entrypoint
// redis-server.
func buildRedisImage(t testing.TB) string {
	t.Helper()
	files := map[string]string{} // image path -> host file
	for _, bin := range []string{"redis-server", "redis-benchmark"} {
		p, err := sysexec.Path(bin)
		if err != nil {
			t.Fatal(err)
		}
		// redis-server is a link to redis-check-rdb, which picks its role
		// from argv[0]: the image holds the file under the server's name.
		files["/usr/bin/"+bin] = p
		out, err := sysexec.Command(context.Background(), "ldd", p).Output()
		if err != nil {
			t.Fatalf("ldd %s: %v", p, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
				files[f[2]] = f[2]
			case len(f) >= 1 && strings.HasPrefix(f[0], "/"): // the dynamic loader
				files[f[0]] = f[0]
			}
		}
	}
	if len(files) < 4 {
		t.Fatalf("redis image: only %v", files)
	}
	repo, err := toolbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ezimage, err := toolbin.Build(context.Background(), repo, "ezimage")
	if err != nil {
		t.Fatal(err)
	}
	tar := filepath.Join(workDir, "redis.tar")
	args := []string{"--out", tar, "--name", redisImage, "--entrypoint", "/usr/bin/redis-server", "--dir", "/tmp:01777"}
	for dst, src := range files {
		args = append(args, "--file", src+":"+dst)
	}
	if out, err := sysexec.Command(context.Background(), ezimage, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis image: %v\n%s", err, out)
	}
	return tar
}
