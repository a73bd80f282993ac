//go:build k8s

package k8s

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/k8scluster"
	"github.com/eztunnel/eztunnel/lab/workload"
)

func kubectl(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := cl.Kubectl(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func apply(t testing.TB, yaml string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cl.KubectlIn(ctx, strings.NewReader(yaml), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// applyNamespace creates namespace ns, labelled test: eztunnel-k8s and
// with labels, and objects in it (a YAML stream of its pods and Services,
// each document starting with ---), deletes the namespace when the test
// ends, and waits until pods are Ready.
func applyNamespace(t testing.TB, ns string, labels map[string]string, objects string, pods ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cl.Kubectl(ctx, "delete", "namespace", ns, "--wait=true", "--timeout=90s")
	})
	var lb strings.Builder
	for k, v := range labels {
		fmt.Fprintf(&lb, "    %s: %q\n", k, v)
	}
	apply(t, fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n  labels:\n    test: eztunnel-k8s\n%s%s", ns, lb.String(), objects))
	args := []string{"-n", ns, "wait", "--for=condition=Ready"}
	for _, p := range pods {
		args = append(args, "pod/"+p)
	}
	kubectl(t, append(args, "--timeout=120s")...)
}

// podIP is the IP of pod name in namespace ns.
func podIP(t testing.TB, ns, name string) string {
	t.Helper()
	return strings.TrimSpace(kubectl(t, "-n", ns, "get", "pod", name, "-o", "jsonpath={.status.podIP}"))
}

// metricsAt reads the metrics served at addr, failing the test if it
// cannot.
func metricsAt(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	m, err := scrapeAt(addr)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// app is a namespace with a server pod, a client pod and a ClusterIP
// Service in front of the server; both pods run the lab's workload server
// (streams on 7000, echo on 7001), the client is where streams start.
type app struct {
	ns       string
	serverIP string
	svcIP    string
}

// newApp creates namespace ns (with labels) and its pods and Service, and
// deletes the namespace when the test ends.
func newApp(t testing.TB, ns string, labels map[string]string) *app {
	t.Helper()
	pod := func(name string) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: %s}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: w
    image: %s
    imagePullPolicy: Never
    args: [workload, serve, --stream, "0.0.0.0:7000", --echo, "0.0.0.0:7001", --pool, "0.0.0.0:7300"]
`, name, ns, name, labImage)
	}
	applyNamespace(t, ns, labels, pod("server")+pod("client")+fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: server, namespace: %s}
spec:
  selector: {app: server}
  ports: [{name: stream, port: 80, targetPort: 7000}, {name: echo, port: 81, targetPort: 7001}, {name: pool, port: 82, targetPort: 7300}]
`, ns), "server", "client")
	a := &app{ns: ns}
	a.serverIP = podIP(t, ns, "server")
	a.svcIP = strings.TrimSpace(kubectl(t, "-n", ns, "get", "service", "server", "-o", "jsonpath={.spec.clusterIP}"))
	if a.serverIP == "" || a.svcIP == "" {
		t.Fatalf("%s: server pod IP %q, service IP %q", ns, a.serverIP, a.svcIP)
	}
	// Both sides up and reachable before anything is measured.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if _, err := a.streamErr(ctx, a.serverIP+":7000", 1, 1024, false, 0); err == nil {
			break
		} else if ctx.Err() != nil {
			t.Fatalf("%s: server not reachable: %v", ns, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	// kube-proxy has the server behind each port of the Service (a pod
	// being ready does not mean its endpoint is programmed yet: a connect
	// to the ClusterIP meanwhile is refused).
	for port, target := range map[string]string{"stream": "7000", "echo": "7001", "pool": "7300"} {
		waitKubeProxy(t, ns+"/server:"+port, net.JoinHostPort(a.serverIP, target))
	}
	return a
}

// streamErr runs `eztunnel-lab workload stream` in the client pod: conns
// byte-exact streams of size bytes each way (the server checks the upstream,
// the client the downstream, against the same seeded generator).
func (a *app) streamErr(ctx context.Context, addr string, conns int, size uint64, _ bool, pause time.Duration) (workload.StreamReport, error) {
	args := []string{"-n", a.ns, "exec", "client", "--", "/eztunnel-lab", "workload", "stream",
		"--addr", addr, "--conns", strconv.Itoa(conns), "--up", strconv.FormatUint(size, 10),
		"--down", strconv.FormatUint(size, 10), "--seed", strconv.FormatInt(time.Now().UnixNano()%1e9, 10)}
	if pause > 0 {
		args = append(args, "--pause", pause.String())
	}
	out, err := cl.Kubectl(ctx, args...)
	var rep workload.StreamReport
	if jerr := json.Unmarshal(out, &rep); jerr != nil && err == nil {
		err = fmt.Errorf("stream report %q: %w", out, jerr)
	}
	return rep, err
}

func (a *app) stream(t testing.TB, addr string, conns int, size uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := a.streamErr(ctx, addr, conns, size, false, 0)
	if err != nil {
		t.Fatalf("%s: streams to %s: %v", a.ns, addr, err)
	}
	if rep.Conns != conns || len(rep.Failures) != 0 {
		t.Fatalf("%s: streams to %s: %+v", a.ns, addr, rep)
	}
}

// metrics scrapes the agent's metrics endpoint (hostNetwork, node IP).
func metrics(t testing.TB) map[string]float64 {
	t.Helper()
	return metricsAt(t, agentMetrics)
}

// agentMetrics is where the DaemonSet's agent serves its metrics.
const agentMetrics = k8scluster.NodeIP + ":9876"

func scrape() (map[string]float64, error) { return scrapeAt(agentMetrics) }

// scrapeAt scrapes an agent's metrics at host:port; a histogram's _count
// and _sum are series like any other.
func scrapeAt(addr string) (map[string]float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	r, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	if r.StatusCode != 200 {
		return nil, fmt.Errorf("metrics: %s", r.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				m[line[:i]] += v
			}
		}
	}
	return m, sc.Err()
}

// pairs is the agent's count of selected connections it decided: paired
// (both directions on the shortcut), or left on the kernel path because the
// client wrote before its server was paired (an early-data fallback, which
// the e2e tests accept too: requirePaired). Any other miss stays a miss.
func pairs(t testing.TB) float64 {
	t.Helper()
	paired, early := shortcutCounts(t)
	return paired + early
}

// fallbacks lists the agent's fallback counters (why connections were not paired).
func fallbacks(t testing.TB) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, v := range metrics(t) {
		if strings.HasPrefix(k, "eztunnel_fallbacks_total{") && v > 0 {
			out[k] = v
		}
	}
	return out
}

// shortcutCounts reads the agent's paired connections and early-data fallbacks.
func shortcutCounts(t testing.TB) (paired, early float64) {
	t.Helper()
	m := metrics(t)
	paired, ok := m["eztunnel_pairs_total"]
	if !ok {
		t.Fatal("eztunnel_pairs_total missing from the agent's metrics")
	}
	return paired, m[`eztunnel_fallbacks_total{reason="early_data"}`]
}

// agentPods lists the running agent pods.
func agentPods(t testing.TB) []string {
	t.Helper()
	out := kubectl(t, "-n", agentNS, "get", "pods", "-l", "app.kubernetes.io/name=eztunnel", "-o", "jsonpath={.items[*].metadata.name}")
	return strings.Fields(out)
}

// podsCgroup is the pods' root cgroup in the cgroup2 hierarchy (cgroupfs
// driver: kubepods).
func podsCgroup() string { return filepath.Join(cg2Root, "kubepods") }

// leftovers reports pins under pinPath and eztunnel programs (ez_*) still
// attached anywhere (BPF links) or on the pods' root cgroup.
// removeAgent deletes the agent's namespace (the DaemonSet's removal makes
// the last agent remove the datapath), waits for the host to hold no
// eztunnel state and otherwise runs `eztunnel uninstall` on the host, so
// that a test that failed before its own uninstall leaves nothing to the
// next one.
func removeAgent(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl.Kubectl(ctx, "delete", "namespace", agentNS, "--ignore-not-found", "--wait=true", "--timeout=90s")
	deadline := time.Now().Add(60 * time.Second)
	for len(leftovers()) > 0 && time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond)
	}
	if l := leftovers(); len(l) > 0 {
		out, err := sysexec.Command(ctx, filepath.Join(workDir, "eztunnel"), "uninstall", "--pin-path", pinPath).CombinedOutput()
		t.Logf("after the agent's namespace was deleted: %v; eztunnel uninstall on the host: %v\n%s", l, err, out)
		if l := leftovers(); len(l) > 0 {
			t.Errorf("eztunnel state left after the test: %v", l)
		}
	}
}

// streamUDPPod is a pod manifest serving byte streams (TCP 7000) and UDP
// echoes (7001) with the lab image.
func streamUDPPod(name, ns string) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: w
    image: %s
    imagePullPolicy: Never
    args: [workload, serve, --stream, "0.0.0.0:7000"]
  - name: u
    image: %s
    imagePullPolicy: Never
    args: [workload, udp, --serve, "0.0.0.0:7001"]
`, name, ns, labImage, labImage)
}

func leftovers() []string {
	var out []string
	if ents, err := os.ReadDir(pinPath); err == nil {
		for _, e := range ents {
			out = append(out, "pinned: "+filepath.Join(pinPath, e.Name()))
		}
	}
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		info, err := it.Link.Info()
		if err != nil {
			continue
		}
		p, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			continue
		}
		pi, err := p.Info()
		p.Close()
		if err == nil && strings.HasPrefix(pi.Name, "ez_") {
			out = append(out, fmt.Sprintf("link %d: program %s (type %d)", info.ID, pi.Name, info.Type))
		}
	}
	if f, err := os.Open(podsCgroup()); err == nil {
		defer f.Close()
		for _, at := range []ebpf.AttachType{ebpf.AttachCGroupSockOps, ebpf.AttachCGroupInetEgress} {
			if res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at}); err == nil && len(res.Programs) > 0 {
				out = append(out, fmt.Sprintf("%d programs on %s (%s)", len(res.Programs), podsCgroup(), at))
			}
		}
	}
	return out
}

// summarized is t with its failures repeated once more at the very end of
// the test's output, after the agents' logs its cleanups print: an excerpt
// of a CI log around "--- FAIL" then still shows why.
func summarized(t *testing.T) testing.TB {
	s := &summary{TB: t}
	t.Cleanup(func() { // registered first: runs last
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.msgs) > 0 {
			t.Logf("the failures, again:\n\t%s", strings.Join(s.msgs, "\n\t"))
		}
	})
	return s
}

type summary struct {
	testing.TB
	mu   sync.Mutex
	msgs []string
}

func (s *summary) note(msg string) {
	s.mu.Lock()
	s.msgs = append(s.msgs, msg)
	s.mu.Unlock()
}

func (s *summary) Error(args ...any) { s.TB.Helper(); s.note(fmt.Sprint(args...)); s.TB.Error(args...) }
func (s *summary) Fatal(args ...any) { s.TB.Helper(); s.note(fmt.Sprint(args...)); s.TB.Fatal(args...) }
func (s *summary) Errorf(format string, args ...any) {
	s.TB.Helper()
	s.note(fmt.Sprintf(format, args...))
	s.TB.Errorf(format, args...)
}
func (s *summary) Fatalf(format string, args ...any) {
	s.TB.Helper()
	s.note(fmt.Sprintf(format, args...))
	s.TB.Fatalf(format, args...)
}
