package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/eztunnel/eztunnel/internal/chartobs"
	"github.com/eztunnel/eztunnel/internal/toolbin"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// TestDashboardMetricsLive: every eztunnel_* metric the chart's Grafana
// dashboard and PrometheusRule name (the chart rendered with both enabled;
// a histogram's _bucket/_sum/_count as its family) is in the /metrics of a
// live agent running every family: the socket shortcut, the bridge bypass
// (be_liberal, conntrack running) and the Service load balancer (a
// services file). Only kube-state-metrics' names (chartobs.KubeStateMetrics)
// are not the agent's; deploy TestChartDashboardAndRules checks that the
// queries parse and select nothing else.
func TestDashboardMetricsLive(t *testing.T) {
	root, err := toolbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := chartobs.Render(t.Context(), root)
	if err != nil {
		t.Fatal(err)
	}
	o, err := chartobs.Extract(rendered)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, r := range o.Rules {
		exprs = append(exprs, r.Expr)
	}
	names := chartobs.Families(o.DashboardJSON, strings.Join(exprs, "\n"))
	// A check of nothing would pass: the names must be there, the ones
	// expected among them, from both objects.
	if len(names) < len(chartobs.WantFamilies) || len(chartobs.Families(strings.Join(exprs, "\n"))) < 3 {
		t.Fatalf("found %d metric names (%v), %d of them in the alerts: the extraction is broken", len(names), names, len(chartobs.Families(strings.Join(exprs, "\n"))))
	}
	for _, w := range chartobs.WantFamilies {
		if !slices.Contains(names, w) {
			t.Errorf("the dashboard and the alerts do not name %s", w)
		}
	}

	l := newMultinode(t, multinode.Options{Name: "mndash", Nodes: 1})
	n := l.Node(1)
	a1, a2 := mnPod(t, n, "a1"), mnPod(t, n, "a2")
	setBeLiberal(t, n, "1")
	pin := "/sys/fs/bpf/eztunnel-e2e-mndash"
	uninstallOnCleanup(t, n, pin)
	nodeTalksTo(t, a1)
	nodeTalksTo(t, a2)
	sink := sinkServer(t, a2, false)
	svcFile := filepath.Join(t.TempDir(), "services.yaml")
	writeServices(t, svcFile, fmt.Sprintf("services:\n- {name: web, ip: 10.96.77.10, port: 80, backends: [%q]}\n", sink.String()))
	startNodeAgent(t, t, n, "run", "--bypass", "--cgroup", n.Managed, "--pin-path", pin,
		"--lock-file", filepath.Join(t.TempDir(), "agent.lock"), "--adopt=false", "--metrics-addr", bpMetricsAddr,
		"--services", "--services-file", svcFile)
	mc := nodeClient(n)
	waitMetrics(t, mc, "the bypass attached and the services written", func(m map[string]float64) bool {
		return m["eztunnel_bypass_devices"] >= 2 && m["eztunnel_services_frontends"] == 1
	})
	transfer(t, a1, sink, 1<<20)

	resp, err := mc.Get("http://" + bpMetricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if f, ok := fams[name]; !ok || len(f.GetMetric()) == 0 {
			t.Errorf("the chart's dashboard or alerts name %s, which the agent does not export", name)
		}
	}
	t.Logf("%d metric families of the dashboard and the alerts, all exported: %s", len(names), strings.Join(names, " "))
}
