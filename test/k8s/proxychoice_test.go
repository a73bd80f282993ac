//go:build k8s

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// wait polls the metrics until ok.
func (a *svcAgent) wait(what string, ok func(m map[string]float64) bool) {
	a.t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m := a.metrics()
		if ok(m) {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s: not reached in 30 s: proxied_pods %v, pod_choice_invalid %v", what, m["eztunnel_services_proxied_pods"], m["eztunnel_services_pod_choice_invalid"])
		}
	}
}

// podPID is a process of the pod (for its network namespace), found in
// its cgroup under the pods' root.
func podPID(t testing.TB, ns, pod string) string {
	t.Helper()
	uid := strings.TrimSpace(kubectl(t, "-n", ns, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}"))
	for _, pat := range []string{"pod" + uid + "/*/cgroup.procs", "*/pod" + uid + "/*/cgroup.procs"} {
		files, _ := filepath.Glob(filepath.Join(podsCgroup(), pat))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			if fs := strings.Fields(string(b)); len(fs) > 0 {
				return fs[0]
			}
		}
	}
	t.Fatalf("pod %s/%s (%s): no process in its cgroup under %s", ns, pod, uid, podsCgroup())
	return ""
}

// TestServicesProxyChoice checks the per-pod choice of the Service load
// balancer against the real kubelet, API server and kube-proxy. Two pods
// have a mesh's interception (iptables REDIRECT of every TCP connection
// but those of uid 1337, installed in the pod's netns from the host) and
// a proxy container running as 1337 that forwards each connection to its
// SO_ORIGINAL_DST: m is annotated eztunnel.io/services: proxy:1337, d is
// not. Before the agent (kube-proxy alone) the proxies learn the
// ClusterIP; with the agent both still do, byte-exact streams every time:
// m's because its application's connects are left untranslated (conntrack
// answers, the proxy's connect is translated), d's because the getsockopt
// hook answers. A pod with a bad value is counted and keeps the default.
// The choice survives a restart (pinned), into Kubernetes mode, where the
// pod selection and the load balancer share one watch of the node's pods,
// and goes with the annotation and with the pod.
func TestServicesProxyChoice(tt *testing.T) {
	t := summarized(tt)
	const ns = "ez-proxychoice"
	pod := func(name, annotation string, proxy bool) string {
		ann := ""
		if annotation != "" {
			ann = fmt.Sprintf(", annotations: {eztunnel.io/services: %q}", annotation)
		}
		y := fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: %s}%s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %s
    imagePullPolicy: Never
    args: [workload, serve, --stream, "0.0.0.0:7000"]
`, name, ns, name, ann, labImage)
		if proxy {
			y += fmt.Sprintf(`  - name: proxy
    image: %s
    imagePullPolicy: Never
    args: [workload, origproxy, --addr, "0.0.0.0:15001"]
    securityContext: {runAsUser: 1337, runAsGroup: 1337}
`, labImage)
		}
		return y
	}
	applyNamespace(t, ns, nil, pod("s", "", false)+pod("m", "proxy:1337", true)+pod("d", "", true)+pod("x", "proxy:istio", false)+fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: %s}
spec:
  selector: {app: s}
  ports: [{name: stream, port: 80, targetPort: 7000}]
`, ns), "s", "m", "d", "x")
	sIP := podIP(t, ns, "s")
	vipIP := strings.TrimSpace(kubectl(t, "-n", ns, "get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"))
	vip := net.JoinHostPort(vipIP, "80")
	waitKubeProxy(t, ns+"/web:stream", net.JoinHostPort(sIP, "7000"))
	for _, p := range []string{"m", "d"} {
		out, err := sysexec.Command(context.Background(), "nsenter", "-t", podPID(t, ns, p), "-n", "iptables", "-w", "-t", "nat", "-A", "OUTPUT",
			"-p", "tcp", "-m", "owner", "!", "--uid-owner", "1337", "-j", "REDIRECT", "--to-ports", "15001").CombinedOutput()
		if err != nil {
			t.Fatalf("REDIRECT in pod %s: %v\n%s", p, err, out)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	seenLines := map[string]int{}
	// through streams n connections from pod p's application to the
	// ClusterIP (through its proxy) and returns what the proxy saw of them.
	through := func(what, p string, n int) []workload.OrigProxyConn {
		t.Helper()
		out, err := cl.Kubectl(ctx, "-n", ns, "exec", p, "-c", "app", "--", "/eztunnel-lab", "workload", "stream", "--addr", vip,
			"--conns", fmt.Sprint(n), "--up", "65536", "--down", "65536", "--seed", "5")
		var rep workload.StreamReport
		if jerr := json.Unmarshal(out, &rep); err != nil || jerr != nil || rep.Conns != n || len(rep.Failures) > 0 {
			t.Fatalf("%s: streams from %s to %s: %v %v %+v: %q", what, p, vip, err, jerr, rep, out)
		}
		if p == "x" {
			return nil
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			logs, err := cl.Kubectl(ctx, "-n", ns, "logs", p, "-c", "proxy")
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(logs)), "\n")
			if len(lines) >= seenLines[p]+n {
				var conns []workload.OrigProxyConn
				for _, l := range lines[seenLines[p]:] {
					var c workload.OrigProxyConn
					if err := json.Unmarshal([]byte(l), &c); err != nil {
						t.Fatalf("%s: proxy log line %q: %v", what, l, err)
					}
					conns = append(conns, c)
				}
				seenLines[p] = len(lines)
				return conns
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d proxy log lines in %s, want %d more", what, len(lines), p, n)
			}
		}
	}
	// learns checks every connection's proxy saw the ClusterIP, and its
	// own connection's peer is the ClusterIP too.
	learns := func(what string, conns []workload.OrigProxyConn) {
		t.Helper()
		for _, c := range conns {
			if c.Orig != vip || c.Upstream != vip || c.Error != "" {
				t.Errorf("%s: the proxy saw %+v, want %s as SO_ORIGINAL_DST and as its upstream's peer", what, c, vip)
				return
			}
		}
		t.Logf("%s: the proxy learnt %s for %d connections", what, vip, len(conns))
	}
	const n = 8
	// kube-proxy alone: the reference.
	learns("kube-proxy, annotated pod", through("kube-proxy, annotated pod", "m", n))
	learns("kube-proxy, plain pod", through("kube-proxy, plain pod", "d", n))

	a := newSvcAgent(t, svcPin)
	a.start()
	const (
		tcpK   = `eztunnel_services_translations_total{kind="tcp_connect"}`
		origK  = `eztunnel_services_reverse_translations_total{kind="original_dst"}`
		leftK  = "eztunnel_services_left_to_proxy_total"
		podsK  = "eztunnel_services_proxied_pods"
		badK   = "eztunnel_services_pod_choice_invalid"
		frontK = "eztunnel_services_frontends"
	)
	a.wait("m left to its proxy, x's bad value counted, web's frontend written", func(m map[string]float64) bool {
		return m[podsK] == 1 && m[badK] == 1 && m[frontK] >= 2
	})
	if !strings.Contains(a.logs.String(), "invalid pod annotation") {
		t.Errorf("x's bad annotation not logged")
	}
	// counts checks how the agent's counters grew over f.
	counts := func(what string, wantTCP, wantOrig, wantLeft float64, f func()) {
		t.Helper()
		before := a.metrics()
		f()
		after := a.metrics()
		for _, c := range []struct {
			k    string
			want float64
		}{{tcpK, wantTCP}, {origK, wantOrig}, {leftK, wantLeft}} {
			if d := after[c.k] - before[c.k]; d != c.want {
				t.Errorf("%s: %s grew by %v, want %v", what, c.k, d, c.want)
			}
		}
	}
	// Left to its proxy: the application's connects are not translated
	// (conntrack answers SO_ORIGINAL_DST), the proxy's are.
	counts("annotated pod", n, 0, n, func() { learns("eztunnel, annotated pod", through("eztunnel, annotated pod", "m", n)) })
	// Default: both translated, the hook answers.
	counts("plain pod", 2*n, n, 0, func() { learns("eztunnel, plain pod", through("eztunnel, plain pod", "d", n)) })
	// A bad value keeps the default: translated at the socket.
	counts("pod with a bad value", n, 0, 0, func() { through("eztunnel, pod with a bad value", "x", n) })

	// Restart: the choice is pinned; it holds with no agent and after.
	a.stop()
	out, err := sysexec.Command(ctx, filepath.Join(workDir, "eztunnel"), "status", "--pin-path", svcPin, "-o", "json").Output()
	var st struct {
		Services *struct {
			Proxied  int               `json:"proxied"`
			Counters map[string]uint64 `json:"counters"`
		} `json:"services"`
	}
	if err != nil || json.Unmarshal(out, &st) != nil || st.Services == nil || st.Services.Proxied != 1 {
		t.Fatalf("status with the agent stopped: %v: %s (want 1 pod left to its proxy)", err, out)
	}
	left0 := st.Services.Counters["left_to_proxy"]
	learns("no agent, annotated pod", through("no agent, annotated pod", "m", n))
	out, err = sysexec.Command(ctx, filepath.Join(workDir, "eztunnel"), "status", "--pin-path", svcPin, "-o", "json").Output()
	if err != nil || json.Unmarshal(out, &st) != nil || st.Services == nil || st.Services.Counters["left_to_proxy"] != left0+n {
		t.Errorf("no agent: left_to_proxy %d -> %s, want +%d", left0, out, n)
	}
	// Restarted in Kubernetes mode: the pods left to their proxy come from
	// the watch the pod selection shares (one watch of the node's pods).
	a.kubernetes = true
	logged := len(a.logs.String())
	a.start()
	a.wait("restarted", func(m map[string]float64) bool { return m[podsK] == 1 })
	if n := strings.Count(a.logs.String()[logged:], "kubernetes: watching pods"); n != 2 {
		t.Errorf("Kubernetes mode: %d consumers of the pod watch logged, want 2 (selection, pods left to their proxy)", n)
	}
	counts("annotated pod after a restart", n, 0, n, func() { learns("restarted, annotated pod", through("restarted, annotated pod", "m", n)) })

	// The annotation removed: the default again (the hook answers).
	kubectl(t, "-n", ns, "annotate", "pod", "m", "eztunnel.io/services-")
	a.wait("annotation removed", func(m map[string]float64) bool { return m[podsK] == 0 })
	counts("annotation removed", 2*n, n, 0, func() { learns("annotation removed", through("annotation removed", "m", n)) })
	// Annotated again, then the pod deleted: its entry goes.
	kubectl(t, "-n", ns, "annotate", "pod", "m", "eztunnel.io/services=proxy")
	a.wait("annotated again", func(m map[string]float64) bool { return m[podsK] == 1 })
	kubectl(t, "-n", ns, "delete", "pod", "m", "x", "--wait=true", "--timeout=60s")
	a.wait("pods deleted", func(m map[string]float64) bool { return m[podsK] == 0 && m[badK] == 0 })
	a.stop()
}
