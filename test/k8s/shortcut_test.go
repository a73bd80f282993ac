//go:build k8s

package k8s

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eztunnel/eztunnel/internal/agentapi"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/parts"
	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/internal/toolbin"
	"github.com/eztunnel/eztunnel/lab/workload"
)

const (
	agentNS   = "eztunnel-system"
	release   = "eztunnel"
	chartDir  = "../../deploy/helm/eztunnel"
	labelKey  = "eztunnel.io/shortcut"
	optInKey  = "eztunnel.io/shortcut-opt-in"
	streamLen = 4 << 20 // bytes each way per connection
)

// installer puts the agent DaemonSet on the cluster with helm and the
// chart in deploy/.
type installer struct{ bin string }

func newInstaller(t testing.TB) *installer {
	repo, err := toolbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bin, err := toolbin.Build(ctx, repo, "helm")
	if err != nil {
		t.Fatalf("helm: %v", err)
	}
	return &installer{bin: bin}
}

func (h *installer) helm(t testing.TB, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := sysexec.Command(ctx, h.bin, append(args, "--kubeconfig", cl.Kubeconfig)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm %s: %v\n%s\nagent log:\n%s", strings.Join(args, " "), err, out, agentLogs(t))
	}
}

func (h *installer) install(t testing.TB, tag string, set ...string) {
	args := []string{"upgrade", "--install", release, chartDir, "-n", agentNS, "--create-namespace",
		"--set", "image.repository=" + agentRepo, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "cgroup2Path=" + cg2Root, "--wait", "--timeout", "3m"}
	for _, kv := range set {
		args = append(args, "--set", kv)
	}
	h.helm(t, args...)
	waitAgentReady(t)
}

func (h *installer) upgrade(t testing.TB, tag string, set ...string) { h.install(t, tag, set...) }

func (h *installer) uninstall(t testing.TB) {
	h.helm(t, "uninstall", release, "-n", agentNS, "--wait", "--timeout", "3m")
}

// waitAgentReady waits for the rollout to finish and the agent to serve
// metrics.
func waitAgentReady(t testing.TB) {
	t.Helper()
	kubectl(t, "-n", agentNS, "rollout", "status", "daemonset/"+release, "--timeout=180s")
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := scrape()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent metrics: %v\n%s", err, agentLogs(t))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func agentLogs(t testing.TB) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := cl.Kubectl(ctx, "-n", agentNS, "logs", "daemonset/"+release, "--tail=50")
	if err != nil {
		// Not started: the pod's events say why.
		desc, _ := cl.Kubectl(ctx, "-n", agentNS, "describe", "pods")
		return err.Error() + "\n" + string(desc)
	}
	return string(out)
}

// accelerated runs conns streams from a's client to addr and reports how
// many connection pairs the agent put on the shortcut meanwhile.
func accelerated(t testing.TB, a *app, addr string, conns int) float64 {
	t.Helper()
	before := pairs(t)
	a.stream(t, addr, conns, streamLen)
	return pairs(t) - before
}

// waitPolicy polls short streams until the shortcut is (or is not) taken,
// so that a relabelling has reached the agent before the counted run.
func waitPolicy(t testing.TB, a *app, on bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := accelerated(t, a, a.serverIP+":7000", 1)
		if (n > 0) == on {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: shortcut taken=%v 30 s after relabelling; agent log:\n%s", a.ns, n > 0, agentLogs(t))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubernetes installs the agent and runs the checks in order on one
// install: selection and relabelling, pod to pod and through a Service, the
// agent's logs, metrics and CLI, an image upgrade under traffic and the
// uninstall under traffic.
func TestKubernetes(t *testing.T) {
	if l := leftovers(); len(l) > 0 {
		t.Fatalf("eztunnel state before the install: %v", l)
	}
	inst := newInstaller(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", agentLogs(t))
		}
		removeAgent(t)
	})
	start := time.Now()
	inst.install(t, agentTag)
	t.Logf("agent installed and ready in %.1fs", time.Since(start).Seconds())

	on := newApp(t, "ez-on", map[string]string{labelKey: "enabled"})
	off := newApp(t, "ez-off", nil)
	const conns = 8

	t.Run("selection", func(t *testing.T) {
		for _, a := range []*app{on, off} {
			for _, addr := range []string{a.serverIP + ":7000", a.svcIP + ":80"} {
				n := accelerated(t, a, addr, conns)
				switch {
				case a == on && n < conns:
					t.Errorf("%s -> %s: %v of %d connections on the shortcut, want all", a.ns, addr, n, conns)
				case a == off && n != 0:
					t.Errorf("%s (unlabelled) -> %s: %v connections on the shortcut, want none", a.ns, addr, n)
				default:
					t.Logf("%s -> %s: %d byte-exact streams of %d MiB each way, %v on the shortcut", a.ns, addr, conns, streamLen>>20, n)
				}
			}
		}
	})

	t.Run("close-unread", func(t *testing.T) {
		// A server that closes with received bytes unread: plain TCP sends
		// RST (the client reads ECONNRESET, then EPIPE). Through the agent's
		// device links on the pods' veths the accelerated connection ends
		// the same way (bpf/shortcut/closereset.h).
		obs := map[string]string{}
		for _, a := range []*app{on, off} {
			ctx, cancel := context.WithCancel(context.Background())
			srv := make(chan error, 1)
			go func() {
				_, err := cl.Kubectl(ctx, "-n", a.ns, "exec", "server", "--", "/eztunnel-lab", "workload", "probe-server",
					"--addr", ":7100", "--ready-file", "/probe.ready")
				srv <- err
			}()
			waitCtx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
			for {
				if _, err := cl.Kubectl(waitCtx, "-n", a.ns, "exec", "server", "--", "/eztunnel-lab", "workload", "wait-file", "/probe.ready"); err == nil {
					break
				}
				if waitCtx.Err() != nil {
					t.Fatalf("%s: probe-server not ready", a.ns)
				}
				time.Sleep(200 * time.Millisecond)
			}
			wcancel()
			before := metrics(t)
			out := kubectl(t, "-n", a.ns, "exec", "client", "--", "/eztunnel-lab", "workload", "probe",
				"--addr", a.serverIP+":7100", "--scenario", "close_unread")
			after := metrics(t)
			cancel()
			<-srv
			obs[a.ns] = strings.TrimSpace(out)
			sent := after["eztunnel_close_resets_sent_total"] - before["eztunnel_close_resets_sent_total"]
			t.Logf("%s: %s (FINs sent as RST: %v)", a.ns, obs[a.ns], sent)
			if want := map[*app]float64{on: 1, off: 0}[a]; sent != want {
				t.Errorf("%s: %v FINs sent as RST, want %v", a.ns, sent, want)
			}
		}
		if obs[on.ns] != obs[off.ns] || !strings.Contains(obs[off.ns], `"3_read":"ECONNRESET"`) {
			t.Errorf("close with unread data: accelerated %s, plain %s; want the same, with ECONNRESET", obs[on.ns], obs[off.ns])
		}
	})

	t.Run("relabel", func(t *testing.T) {
		kubectl(t, "label", "namespace", off.ns, labelKey+"=enabled", "--overwrite")
		kubectl(t, "label", "namespace", on.ns, labelKey+"=disabled", "--overwrite")
		waitPolicy(t, off, true)
		waitPolicy(t, on, false)
		if n := accelerated(t, off, off.svcIP+":80", conns); n < conns {
			t.Errorf("%s relabelled enabled: %v of %d on the shortcut", off.ns, n, conns)
		}
		if n := accelerated(t, on, on.svcIP+":80", conns); n != 0 {
			t.Errorf("%s relabelled disabled: %v on the shortcut", on.ns, n)
		}
		kubectl(t, "label", "namespace", off.ns, labelKey+"-")
		kubectl(t, "label", "namespace", on.ns, labelKey+"=enabled", "--overwrite")
		waitPolicy(t, off, false)
		waitPolicy(t, on, true)
	})

	t.Run("pod-opt-in", func(t *testing.T) {
		// The tenant: both pods of the unselected namespace annotate
		// themselves enabled. Where the operator said disabled (even with
		// opt-in allowed), or did not allow opt-in, nothing changes.
		kubectl(t, "label", "namespace", off.ns, labelKey+"=disabled", optInKey+"=enabled", "--overwrite")
		for _, p := range []string{"client", "server"} {
			kubectl(t, "-n", off.ns, "annotate", "pod", p, labelKey+"=enabled", "--overwrite")
		}
		// A later change the agent must see, so that it has seen ours.
		kubectl(t, "label", "namespace", on.ns, labelKey+"=disabled", "--overwrite")
		waitPolicy(t, on, false)
		if n := accelerated(t, off, off.serverIP+":7000", conns); n != 0 {
			t.Errorf("%s labelled disabled, pods annotated enabled: %v connections on the shortcut, want none", off.ns, n)
		}
		// The disabled label removed, opt-in allowed: the annotated pods are in.
		kubectl(t, "label", "namespace", off.ns, labelKey+"-")
		waitPolicy(t, off, true)
		// Opt-in no longer allowed: the annotation is ignored again.
		kubectl(t, "label", "namespace", off.ns, optInKey+"-")
		waitPolicy(t, off, false)
		for _, p := range []string{"client", "server"} {
			kubectl(t, "-n", off.ns, "annotate", "pod", p, labelKey+"-")
		}
		kubectl(t, "label", "namespace", on.ns, labelKey+"=enabled", "--overwrite")
		waitPolicy(t, on, true)
	})

	t.Run("observability", func(t *testing.T) {
		pods := agentPods(t)
		if len(pods) != 1 {
			t.Fatalf("agent pods: %v", pods)
		}
		logs := kubectl(t, "-n", agentNS, "logs", pods[0])
		if strings.TrimSpace(logs) == "" {
			t.Error("kubectl logs of the agent pod: empty")
		}
		m := metrics(t)
		if m["eztunnel_datapath_up"] != 1 {
			t.Errorf("eztunnel_datapath_up = %v, want 1", m["eztunnel_datapath_up"])
		}
		if m["eztunnel_pairs_total"] < 2*conns {
			t.Errorf("eztunnel_pairs_total = %v after the selected streams", m["eztunnel_pairs_total"])
		}
		// Per-pod counts, labelled with the selected pods only: conns more
		// connections enrol 2*conns sockets in the client and server pods.
		podCounts := func() (onPods, offSeries float64) {
			for k, v := range metrics(t) {
				if strings.HasPrefix(k, `eztunnel_pod_sockets_enrolled_total{namespace="`+on.ns+`"`) {
					onPods += v
				}
				if strings.HasPrefix(k, `eztunnel_pod_sockets_enrolled_total{namespace="`+off.ns+`"`) {
					offSeries++
				}
			}
			return onPods, offSeries
		}
		on0, _ := podCounts()
		accelerated(t, on, on.svcIP+":80", conns)
		on1, offSeries := podCounts()
		if on1-on0 < 2*conns || offSeries != 0 || metrics(t)["eztunnel_pods_selected"] < 2 {
			t.Errorf("per-pod metrics: %v sockets of %s enrolled by %d connections, %v series for %s, %v pods selected",
				on1-on0, on.ns, conns, offSeries, off.ns, metrics(t)["eztunnel_pods_selected"])
		}
		for _, args := range [][]string{{"status"}, {"connections"}} {
			out := kubectl(t, append([]string{"-n", agentNS, "exec", pods[0], "--", "/eztunnel"}, args...)...)
			if strings.TrimSpace(out) == "" {
				t.Errorf("eztunnel %s in the agent pod: no output", args[0])
			}
		}
	})

	// underTraffic starts streams that connect, pause in the middle (while
	// do runs) and then finish, and checks every byte arrived.
	underTraffic := func(t *testing.T, what string, do func()) {
		t.Helper()
		before := pairs(t)
		paired0, _ := shortcutCounts(t)
		type res struct {
			addr string
			err  error
		}
		done := make(chan res, 2)
		for _, addr := range []string{on.serverIP + ":7000", on.svcIP + ":80"} {
			go func(addr string) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				rep, err := on.streamErr(ctx, addr, conns, streamLen, false, 20*time.Second)
				if err == nil && (rep.Conns != conns || len(rep.Failures) > 0) {
					err = fmt.Errorf("report %+v", rep)
				}
				done <- res{addr, err}
			}(addr)
		}
		// The connections are paired before the change. One may take the
		// kernel path by a counted fallback (a loaded machine): it must stay
		// byte-exact through the change as well.
		deadline := time.Now().Add(15 * time.Second)
		for pairs(t)-before < 2*conns && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if n := pairs(t) - before; n < 2*conns {
			t.Logf("%s: %v of %d connections on the shortcut before the change; fallbacks: %v", what, n, 2*conns, fallbacks(t))
		}
		// Most of them are paired, not early-data fallbacks: what is under
		// test is the paired ones.
		if paired, early := shortcutCounts(t); paired-paired0 < conns {
			t.Fatalf("%s: %v of %d connections paired before the change (%v early-data fallbacks in all)", what, paired-paired0, 2*conns, early)
		}
		do()
		for range 2 {
			r := <-done
			if r.err != nil {
				t.Errorf("%s: streams to %s: %v", what, r.addr, r.err)
			}
		}
	}

	// In the agent's pod with the chart's defaults (no extra capability):
	// status and connections ask the agent's local API. The agent names the
	// selected pods and its pod watch; it names each end of a connection by
	// the socket's cgroup, also where it cannot enter the pod's network
	// namespace.
	t.Run("in-pod-tools", func(t *testing.T) {
		agent := agentPods(t)[0]
		inPod := func(v any, args ...string) {
			t.Helper()
			out := kubectl(t, append([]string{"-n", agentNS, "exec", agent, "--", "/eztunnel"}, append(args, "-o", "json")...)...)
			if err := json.Unmarshal([]byte(out), v); err != nil {
				t.Fatalf("eztunnel %v in the agent pod: %v\n%s", args, err, out)
			}
		}
		var st struct {
			AgentView *agentapi.Status `json:"agent_view"`
			Parts     *parts.Report    `json:"parts"`
		}
		inPod(&st, "status")
		if st.AgentView == nil || st.AgentView.Kubernetes == nil || st.Parts == nil {
			t.Fatalf("status in the agent pod: no agent view or parts: %+v", st)
		}
		k := st.AgentView.Kubernetes
		selected := map[string]bool{}
		for _, p := range k.Selected {
			selected[p.Namespace+"/"+p.Name] = true
		}
		if !k.Watch.Healthy() || !selected[on.ns+"/client"] || !selected[on.ns+"/server"] || selected[off.ns+"/client"] {
			t.Errorf("status: watch %+v, selected %v; want healthy, %s's client and server, none of %s", k.Watch, selected, on.ns, off.ns)
		}
		// bugreport -f - (the root is read-only) with the node's
		// Kubernetes view, read by the agent's service account.
		report := kubectl(t, "-n", agentNS, "exec", agent, "--", "/eztunnel", "bugreport", "-f", "-")
		files := untarGz(t, []byte(report))
		var obj struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		for name, want := range map[string]string{"kubernetes/pod.json": agent, "kubernetes/daemonset.json": release} {
			if err := json.Unmarshal(files["eztunnel-bugreport/"+name], &obj); err != nil || obj.Metadata.Name != want {
				t.Errorf("bugreport %s: %v, name %q, want %q (errors.txt: %s)", name, err, obj.Metadata.Name, want, files["eztunnel-bugreport/errors.txt"])
			}
		}
		if _, ok := files["eztunnel-bugreport/kubernetes/events-"+agent+".json"]; !ok || strings.Contains(string(files["eztunnel-bugreport/errors.txt"]), "kubernetes/") {
			t.Errorf("bugreport: the pod's events missing; errors.txt: %s", files["eztunnel-bugreport/errors.txt"])
		}
		via := ""
		for _, p := range st.Parts.Parts {
			if p.Part == parts.Connections {
				via = p.Via
			}
		}
		underTraffic(t, "listing", func() {
			var ends []datapath.Connection
			inPod(&ends, "connections")
			named := 0
			for _, c := range ends {
				if c.Server.Port() == 7000 && (c.Role == "client" && c.Pod == on.ns+"/client" || c.Role == "server" && c.Pod == on.ns+"/server") {
					named++
				}
			}
			// The listing walks every namespace where the kernel lets the
			// agent run map-element iterators; elsewhere it runs in the
			// namespaces it can enter, without CAP_SYS_ADMIN (the chart's
			// default) the host's only, and the connection index gives
			// the pods' ends.
			indexed := 0
			for _, c := range ends {
				if c.Indexed {
					indexed++
				}
			}
			switch {
			case named < 2*conns:
				t.Errorf("connections (%s): %d of %d ends to :7000 named by pod: %+v", via, named, 2*conns, ends)
			case !strings.HasPrefix(via, "iter/bpf_sk_storage_map") && indexed < named:
				t.Errorf("connections (%s): %d ends from the connection index, want at least the %d pods' ends", via, indexed, named)
			default:
				t.Logf("connections in the agent pod (%s): %d ends named by pod", via, named)
			}
		})
	})

	// kubectl eztunnel status: every agent pod asked through the API
	// server's exec, summed.
	t.Run("plugin-status", func(t *testing.T) {
		plugin := filepath.Join(t.TempDir(), "kubectl-eztunnel")
		if out, err := sysexec.Command(context.Background(), "go", "build", "-o", plugin, "../../cmd/kubectl-eztunnel").CombinedOutput(); err != nil {
			t.Fatalf("build the plugin: %v\n%s", err, out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := sysexec.Command(ctx, plugin, "status", "-o", "json", "--kubeconfig", cl.Kubeconfig, "-n", agentNS).Output()
		if err != nil {
			t.Fatalf("kubectl-eztunnel status: %v\n%s", err, out)
		}
		var cs struct {
			Nodes []struct {
				Node   string               `json:"node"`
				Status *agentapi.NodeStatus `json:"status"`
			} `json:"nodes"`
			Totals struct {
				Nodes        int               `json:"nodes"`
				Answered     int               `json:"answered"`
				AgentsUp     int               `json:"agents_up"`
				WatchHealthy int               `json:"watch_healthy"`
				PodsSelected int               `json:"pods_selected"`
				Counters     map[string]uint64 `json:"counters"`
			} `json:"totals"`
		}
		if err := json.Unmarshal(out, &cs); err != nil {
			t.Fatalf("decode: %v\n%s", err, out)
		}
		tt := cs.Totals
		if len(cs.Nodes) != 1 || cs.Nodes[0].Status == nil || tt.Nodes != 1 || tt.Answered != 1 || tt.AgentsUp != 1 || tt.WatchHealthy != 1 ||
			tt.PodsSelected < 2 || tt.Counters["pairs"] == 0 || tt.Counters["pairs"] != cs.Nodes[0].Status.Counters["pairs"] {
			t.Errorf("kubectl eztunnel status: %+v\n%s", tt, out)
		}
		table, err := sysexec.Command(ctx, plugin, "status", "--kubeconfig", cl.Kubeconfig, "-n", agentNS).Output()
		if err != nil || !strings.Contains(string(table), "TOTAL") || !strings.Contains(string(table), cs.Nodes[0].Node) {
			t.Errorf("table (err %v):\n%s", err, table)
		}
		if out, err := sysexec.Command(ctx, plugin, "status", "--kubeconfig", cl.Kubeconfig, "-n", "no-such-namespace").CombinedOutput(); err == nil ||
			!strings.Contains(string(out), "no agent pods in namespace no-such-namespace") {
			t.Errorf("a namespace without agents: %v\n%s", err, out)
		}

		// kubectl eztunnel connectivity: test pods of the agent's image in
		// a selected and an unselected namespace; removed after.
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		cout, err := sysexec.Command(cctx, plugin, "connectivity", "-o", "json", "--kubeconfig", cl.Kubeconfig, "-n", agentNS).Output()
		var rep struct {
			Cases []struct {
				Name            string `json:"name"`
				WantAccelerated bool   `json:"want_accelerated"`
				Passed          bool   `json:"passed"`
				Results         []struct {
					Exact, Accelerated bool
				} `json:"results"`
			} `json:"cases"`
			Skipped []string `json:"skipped"`
			Passed  bool     `json:"passed"`
			Cleaned bool     `json:"cleaned"`
		}
		if jerr := json.Unmarshal(cout, &rep); err != nil || jerr != nil || !rep.Passed || !rep.Cleaned || len(rep.Cases) != 2 || len(rep.Skipped) != 1 {
			t.Fatalf("kubectl eztunnel connectivity: %v %v\n%s", err, jerr, cout)
		}
		for _, c := range rep.Cases {
			acc := 0
			for _, r := range c.Results {
				if r.Accelerated {
					acc++
				}
			}
			t.Logf("connectivity %s: %d connections, %d accelerated (want %v)", c.Name, len(c.Results), acc, c.WantAccelerated)
			if len(c.Results) != 8 {
				t.Errorf("%s: %d connections checked, want 8 (4 to the pod, 4 to the Service)", c.Name, len(c.Results))
			}
		}
		if left := kubectl(t, "get", "namespaces", "-l", "app.kubernetes.io/part-of=eztunnel-connectivity", "-o", "name"); strings.TrimSpace(left) != "" {
			t.Errorf("connectivity left namespaces: %s", left)
		}
	})

	t.Run("upgrade", func(t *testing.T) {
		old := agentPods(t)
		underTraffic(t, "image upgrade", func() { inst.upgrade(t, agentTagNew) })
		now := agentPods(t)
		if len(now) != 1 || now[0] == old[0] {
			t.Fatalf("agent pods before %v, after the upgrade %v", old, now)
		}
		img := kubectl(t, "-n", agentNS, "get", "pod", now[0], "-o", "jsonpath={.spec.containers[0].image}")
		if img != agentRepo+":"+agentTagNew {
			t.Errorf("agent image after the upgrade: %q", img)
		}
		if n := accelerated(t, on, on.svcIP+":80", conns); n < conns {
			t.Errorf("after the upgrade: %v of %d new connections on the shortcut", n, conns)
		}
	})

	// The other surge mode: the new agent starts next to the old one (same
	// host ports), which hands over through the node lock.
	t.Run("upgrade-surge", func(t *testing.T) {
		old := agentPods(t)
		underTraffic(t, "surge upgrade", func() {
			inst.upgrade(t, agentTag, "updateStrategy.rollingUpdate.maxSurge=1", "updateStrategy.rollingUpdate.maxUnavailable=0")
		})
		now := agentPods(t)
		if len(now) != 1 || now[0] == old[0] {
			t.Fatalf("agent pods before %v, after the upgrade %v", old, now)
		}
		// The node lock (a hostPath) names the new holder and whom it took over from.
		lock, err := os.ReadFile("/run/eztunnel/agent.lock")
		if err != nil || !strings.Contains(string(lock), "pod "+agentNS+"/"+now[0]) || !strings.Contains(string(lock), "took over from pod "+agentNS+"/"+old[0]) {
			t.Errorf("node lock after the surge upgrade (old %s, new %s): %q, %v", old[0], now[0], lock, err)
		}
		if n := accelerated(t, on, on.svcIP+":80", conns); n < conns {
			t.Errorf("after the surge upgrade: %v of %d new connections on the shortcut", n, conns)
		}
	})

	t.Run("uninstall", func(t *testing.T) {
		underTraffic(t, "uninstall", func() { inst.uninstall(t) })
		// The DaemonSet's pods are gone; the last agent drained and removed
		// the datapath.
		deadline := time.Now().Add(60 * time.Second)
		for {
			l := leftovers()
			if len(l) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the uninstall: %v", l)
			}
			time.Sleep(500 * time.Millisecond)
		}
		on.stream(t, on.svcIP+":80", conns, streamLen) // plain TCP still works
	})
}

// TestKubernetesAdoption: a pool opened between two selected pods before
// the DaemonSet exists (pod to pod and through its Service) is adopted by
// the agent installed with adoption.enabled (SYS_ADMIN and hostPID: it
// enters the pods' network namespaces), and stays byte-exact; then the
// uninstall leaves nothing behind.
func TestKubernetesAdoption(tt *testing.T) {
	t := summarized(tt)
	if l := leftovers(); len(l) > 0 {
		t.Fatalf("eztunnel state before the install: %v", l)
	}
	a := newApp(t, "ez-adopt", map[string]string{labelKey: "enabled"})
	const conns = 8
	type pool struct {
		name string
		done chan error
		out  []byte
	}
	var pools []*pool
	for i, addr := range []string{a.serverIP + ":7300", a.svcIP + ":82"} {
		p := &pool{name: fmt.Sprintf("p%d", i), done: make(chan error, 1)}
		pools = append(pools, p)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			var err error
			p.out, err = cl.Kubectl(ctx, "-n", a.ns, "exec", "client", "--", "/eztunnel-lab", "workload", "pool",
				"--addr", addr, "--conns", strconv.Itoa(conns), "--seed", strconv.Itoa(60+i),
				"--ready-file", "/"+p.name+".ready", "--go-file", "/go", "--timeout", "4m")
			p.done <- err
		}()
	}
	for _, p := range pools {
		deadline := time.Now().Add(60 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := cl.Kubectl(ctx, "-n", a.ns, "exec", "client", "--", "/eztunnel-lab", "workload", "wait-file", "/"+p.name+".ready")
			cancel()
			if err == nil {
				break
			}
			select {
			case perr := <-p.done:
				t.Fatalf("pool %s exited before it was ready: %v\n%s", p.name, perr, p.out)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool %s not ready: %v", p.name, err)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	inst := newInstaller(t)
	inst.install(t, agentTag, "adoption.enabled=true", "adoption.interval=2s")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", agentLogs(t))
		}
		removeAgent(t)
	})
	want := float64(2 * conns)
	deadline := time.Now().Add(90 * time.Second)
	for metrics(t)["eztunnel_adopted_total"] < want {
		if time.Now().After(deadline) {
			t.Fatalf("eztunnel_adopted_total %v after 90 s, want %v; skipped: %v", metrics(t)["eztunnel_adopted_total"], want, adoptSkips(t))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("adopted %v connections opened before the agent; skipped %v", metrics(t)["eztunnel_adopted_total"], adoptSkips(t))
	before := metrics(t)["eztunnel_bytes_redirected_total"]
	// The image has no shell and no /tmp: the files live in the container's root.
	kubectl(t, "-n", a.ns, "exec", "client", "--", "/eztunnel-lab", "workload", "touch", "/go")
	for _, p := range pools {
		if err := <-p.done; err != nil {
			t.Fatalf("pool %s: %v\n%s", p.name, err, p.out)
		}
		var res workload.PoolResult
		if err := json.Unmarshal(p.out, &res); err != nil || len(res.Errors) > 0 || res.SHA256Up != res.SHA256Bk || res.BytesUp == 0 {
			t.Fatalf("pool %s not byte-exact: %v %s", p.name, err, p.out)
		}
	}
	if after := metrics(t)["eztunnel_bytes_redirected_total"]; after <= before {
		t.Errorf("the adopted pools were not accelerated: bytes_redirected %v -> %v", before, after)
	}
	inst.uninstall(t)
	deadline = time.Now().Add(60 * time.Second)
	for l := leftovers(); len(l) > 0; l = leftovers() {
		if time.Now().After(deadline) {
			t.Fatalf("after the uninstall: %v", l)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func adoptSkips(t testing.TB) map[string]float64 {
	out := map[string]float64{}
	m, err := scrape()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range m {
		if strings.HasPrefix(k, `eztunnel_adopt_skipped_total{`) {
			out[k] = v
		}
	}
	return out
}

// untarGz returns the files of a .tar.gz by name.
func untarGz(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a gzip stream (%d bytes): %v", len(b), err)
	}
	files := map[string][]byte{}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatalf("tar: %v", err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = data
	}
}
